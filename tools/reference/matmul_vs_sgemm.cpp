// oneDNN's matmul primitive (brgemm) against its BLAS-style dnnl_sgemm on the f32 products of
// training (developer-only; the build never compiles it): why onednn::matmul runs 2-D f32
// products with sgemm (core/src/dnnl/matmul.cpp, docs/PERFORMANCE.md "Training: side by side").
// Operands are plain row-major (K, N) weights and the transposed views the backward reads, as the
// trainer gives them; each figure is the median of 11 runs after one warm-up.
//
//   g++ -O2 -std=c++17 tools/reference/matmul_vs_sgemm.cpp -ldnnl -o /tmp/matmul_vs_sgemm
//   OMP_NUM_THREADS=2 /tmp/matmul_vs_sgemm
#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

using dnnl::memory;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
double median_time(F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < 11; ++i) {
    const double t0 = seconds();
    f();
    t.push_back(seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Shape {
  const char* what;
  int64_t M, K, N;
  bool a_transposed, b_transposed;  // a (M, K) as the view of a (K, M) matrix; b likewise of (N, K)
};

}  // namespace

int main() {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const Shape shapes[] = {
      {"BERT-base W1 forward", 1024, 768, 3072, false, false},
      {"BERT-base W1 dW = xT dy", 768, 1024, 3072, true, false},
      {"BERT-base W1 dx = dy W1T", 1024, 3072, 768, false, true},
      {"BERT-base QKV forward", 1024, 768, 2304, false, false},
      {"BERT-base QKV dW", 768, 1024, 2304, true, false},
      {"BERT-base W2 forward", 1024, 3072, 768, false, false},
      {"BERT-base W2 dW", 3072, 1024, 768, true, false},
      {"char GPT W1 forward", 4096, 192, 768, false, false},
      {"char GPT W1 dW", 192, 4096, 768, true, false},
      {"char GPT W2 forward", 4096, 768, 192, false, false},
      {"char GPT QKV forward", 4096, 192, 576, false, false},
  };
  std::printf("%-26s %18s %24s %24s %7s\n", "product", "M x K x N", "matmul primitive", "dnnl_sgemm", "ratio");
  for (const Shape& sh : shapes) {
    const int64_t M = sh.M, K = sh.K, N = sh.N;
    std::vector<float> A(static_cast<size_t>(M * K), 0.01f), B(static_cast<size_t>(K * N), 0.02f),
        C(static_cast<size_t>(M * N));
    const memory::desc ad = sh.a_transposed ? memory::desc({M, K}, memory::data_type::f32, memory::dims{1, M})
                                            : memory::desc({M, K}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc bd = sh.b_transposed ? memory::desc({K, N}, memory::data_type::f32, memory::dims{1, K})
                                            : memory::desc({K, N}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc cd({M, N}, memory::data_type::f32, memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), eng);
    const dnnl::matmul mm(pd);
    memory am(ad, eng, A.data()), bm(bd, eng, B.data()), cm(cd, eng, C.data());
    const double t_prim = median_time([&] {
      mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      s.wait();
    });
    const double t_gemm = median_time([&] {
      dnnl_sgemm(sh.a_transposed ? 'T' : 'N', sh.b_transposed ? 'T' : 'N', M, N, K, 1.f, A.data(),
                 sh.a_transposed ? M : K, B.data(), sh.b_transposed ? K : N, 0.f, C.data(), N);
    });
    const double gflop = 2e-9 * static_cast<double>(M * N * K);
    char dims[48];
    std::snprintf(dims, sizeof dims, "%lldx%lldx%lld", static_cast<long long>(M), static_cast<long long>(K),
                  static_cast<long long>(N));
    std::printf("%-26s %18s %8.2f ms %5.0f GF/s [%s] %8.2f ms %5.0f GF/s %6.2fx\n", sh.what, dims, t_prim * 1e3,
                gflop / t_prim, pd.impl_info_str(), t_gemm * 1e3, gflop / t_gemm, t_prim / t_gemm);
  }
  return 0;
}
