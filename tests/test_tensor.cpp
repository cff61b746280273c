// Tensor storage, views, copies and dtype conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "tessera/tensor.h"
#include "tessera/tensor_reuse.h"

using namespace tessera;

TEST(Tensor, ZerosAreAlignedContiguousAndZero) {
  Tensor t = Tensor::zeros({3, 5});
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.stride(0), 5);
  EXPECT_EQ(t.stride(1), 1);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % Tensor::kAlignment, 0u);
  for (float v : t.to_vector()) EXPECT_EQ(v, 0.f);
  EXPECT_EQ(t.describe(), "f32 (3, 5)");
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor row = t.select(0, 1);
  EXPECT_EQ(row.shape(), Shape({3}));
  EXPECT_EQ(row.at({2}), 5.f);
  row.data<float>()[0] = 30.f;
  EXPECT_EQ(t.at({1, 0}), 30.f);

  Tensor col = t.slice(1, 1, 3);
  EXPECT_EQ(col.shape(), Shape({2, 2}));
  EXPECT_FALSE(col.is_contiguous());
  EXPECT_EQ(col.at({1, 1}), 5.f);

  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), Shape({3, 2}));
  EXPECT_EQ(tt.at({2, 1}), 5.f);
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), (std::vector<float>{0, 30, 1, 4, 2, 5}));
}

TEST(Tensor, ReshapeAndUnsqueeze) {
  Tensor t = Tensor::from_vector({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor r = t.reshape({3, 2});
  EXPECT_EQ(r.at({2, 0}), 4.f);
  Tensor u = t.unsqueeze(0);
  EXPECT_EQ(u.shape(), Shape({1, 2, 3}));
  EXPECT_EQ(u.at({0, 1, 2}), 5.f);
  Tensor u2 = t.unsqueeze(-1);
  EXPECT_EQ(u2.shape(), Shape({2, 3, 1}));
  EXPECT_EQ(u2.at({1, 1, 0}), 4.f);
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): ties go to even, i.e. 1.
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
}

TEST(Tensor, F16RoundTripsAndRounds) {
  for (float v : {0.f, -0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f /*min normal*/,
                  5.960464477539063e-08f /*min subnormal*/, 0.333251953125f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(1e6f)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f32_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f).bits, 0xc000);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even gives 1.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
}

TEST(Tensor, ConversionsKeepValues) {
  Tensor t = Tensor::from_vector({4}, {1.5f, -2.f, 0.25f, 3.f});
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.to_vector(), t.to_vector());
  Tensor h = t.to(DType::f16);
  EXPECT_EQ(h.to_vector(), t.to_vector());
  Tensor i = Tensor::from_ids({3}, {7, -1, 42});
  EXPECT_EQ(i.to(DType::i64).at({2}), 42.f);
  EXPECT_EQ(i.to(DType::f32).to_vector(), (std::vector<float>{7, -1, 42}));
}

TEST(Tensor, WrapBorrowsAndKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  std::weak_ptr<std::vector<float>> weak = owner;
  Tensor t = Tensor::wrap(owner->data(), {2, 2}, DType::f32, owner);
  owner.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(t.at({1, 0}), 3.f);
  Tensor v = t.select(0, 1);
  t = Tensor();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(v.at({1}), 4.f);
  v = Tensor();
  EXPECT_TRUE(weak.expired());
}

TEST(Tensor, EmptyDimensionsAreFine) {
  Tensor t = Tensor::zeros({0, 4});
  EXPECT_EQ(t.numel(), 0);
  Tensor c = t.clone();
  EXPECT_EQ(c.shape(), Shape({0, 4}));
  EXPECT_TRUE(c.to_vector().empty());
}

TEST(Tensor, UnflattenMakesHeadViews) {
  // (B=1, T=2, 3 heads of D=2) packed as (B, T, H·D); head views are (B, H, T, D).
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = static_cast<float>(i);
  Tensor x = Tensor::from_vector({1, 2, 6}, v);
  Tensor heads = x.unflatten(2, 3, 2).transpose(1, 2);
  EXPECT_EQ(heads.shape(), Shape({1, 3, 2, 2}));
  EXPECT_EQ(heads.at({0, 2, 1, 0}), 10.f);  // head 2, row 1, dim 0 -> column 4 of row 1
  // On a strided slice too: the value block of a fused (T, [q | v]) buffer.
  Tensor qv = Tensor::from_vector({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor vblock = qv.slice(1, 2, 4).unflatten(1, 2, 1);
  EXPECT_EQ(vblock.shape(), Shape({2, 2, 1}));
  EXPECT_EQ(vblock.at({1, 1, 0}), 7.f);
}

// Shapes that change from step to step (padded batches): the kept blocks of sizes done with are
// freed on a miss, so kept and live blocks never hold more than the most the live ones did; a
// repeated shape still gets its block back.
TEST(TensorReuse, KeptAndLiveBlocksStayWithinThePeakOfTheLiveOnes) {
  const TensorReuse reuse;
  const size_t base = TensorReuse::stats().live;  // what other tests left alive
  for (int step = 0; step < 40; ++step) {
    const int64_t rows = 64 + 37 * step;  // 64 KiB and up, a new size class nearly every step
    Tensor a = Tensor::empty({rows, 256}), b = Tensor::empty({rows, 512});
    const TensorReuse::Stats s = TensorReuse::stats();
    EXPECT_LE(s.idle + s.live, s.peak_live) << "step " << step;
  }
  const TensorReuse::Stats end = TensorReuse::stats();
  EXPECT_EQ(end.live, base);
  // The last step's pair is the most live there ever was; the idle blocks fit in it.
  EXPECT_LE(end.idle, end.peak_live - base);
  EXPECT_GT(end.idle, 0u);
  const void* kept = nullptr;
  {
    Tensor a = Tensor::empty({4096, 64});
    kept = a.raw_data();
  }
  Tensor again = Tensor::empty({4096, 64});
  EXPECT_EQ(again.raw_data(), kept);
}

TEST(TensorReuse, KeepsFreedBlocksWhileAliveOnly) {
  const Shape big{512, 1024};  // 2 MiB: above the size kept
  const void* first = nullptr;
  {
    const TensorReuse reuse;
    {
      Tensor a = Tensor::empty(big);
      first = a.raw_data();
    }
    Tensor b = Tensor::empty(big);  // the block a freed
    EXPECT_EQ(b.raw_data(), first);
    Tensor c = Tensor::empty({512, 1000});  // same size class: the block b holds is still taken
    EXPECT_NE(c.raw_data(), b.raw_data());
    b = Tensor();
    Tensor d = Tensor::empty({512, 1000});
    EXPECT_EQ(d.raw_data(), first);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d.raw_data()) % Tensor::kAlignment, 0u);
  }
  // Outside any TensorReuse a freed block goes back to the system: nothing is kept to hand out.
  Tensor e = Tensor::zeros(big);
  EXPECT_EQ(e.data<float>()[big.numel() - 1], 0.f);
}
