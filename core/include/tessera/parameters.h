// Parameters: a model's named tensors, as their own object apart from the ModelConfig that asks
// for them. The names are the stable ones that weight files, `explain`, gradient dumps and exports
// share ("stem.embed", "blocks.3.attn.w_q", ...; see model.h), in parameter_specs order.
//
//   Result<Parameters> p = Parameters::resolve(cfg);  // inline YAML, file (mmap'd views), seeded init
//   Parameters master = p->clone();                   // owned, contiguous f32: what training updates
//   Parameters grads = master.zeros_like();           // same names and shapes, zeros
//   Tensor* w = master.find("blocks.0.attn.w_q");     // mutable (the storage is shared, see below)
//
// Two uses, one type:
//   - running: resolve() hands out zero-copy views of a memory-mapped safetensors file where it can
//     (bf16 or f32 as stored); nothing writes to them;
//   - training: clone() makes owned, contiguous f32 copies that the optimizer updates in place, and
//     zeros_like() their gradients.
// A Parameters is a handle like Tensor: copies share the tensors' storage.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

struct ModelConfig;

// The first non-finite value (NaN, +inf, -inf) of a float tensor (f32, bf16, f16, f64), in
// row-major order: its flat index (-1 when every value is finite), the value, and how many
// non-finite values there are in all. Integer tensors have none. Reads the bits (an all-ones
// exponent), in one vectorised pass over contiguous data; the second, counting pass runs only when
// something was found.
struct NonFiniteScan {
  int64_t index = -1;
  double value = 0;
  int64_t count = 0;
  bool found() const { return index >= 0; }
};
NonFiniteScan find_nonfinite(const Tensor& t);
// Whether t holds a NaN or an infinity: the same vectorised pass, over any view whose last axis is
// dense without copying it.
bool has_nonfinite(const Tensor& t);
// "[1, 2]": the multi-index of row-major flat index `flat` in `shape`.
std::string index_str(const Shape& shape, int64_t flat);
// "NaN", "inf", "-inf".
std::string nonfinite_name(double v);

class Parameters {
 public:
  using Entry = std::pair<std::string, Tensor>;

  Parameters() = default;
  explicit Parameters(std::vector<Entry> entries);

  // Every parameter the config asks for (parameter_specs), from model.weights.inline, then
  // model.weights.file, then seeded init. Missing, unexpected and mis-shaped tensors are reported
  // together in one status, each with its expected and found shape and the YAML place that chose it.
  static Result<Parameters> resolve(const ModelConfig& cfg);

  // Checks that these are exactly the tensors cfg asks for (names, shapes, float dtypes); every
  // problem in one status.
  Status check(const ModelConfig& cfg) const;
  // Every tensor holds only finite values; otherwise one status naming each tensor with a NaN or
  // an infinity (its first one: flat index, multi-index, value; and how many), `origin` (the file
  // they came from) in the message. Model::build(cfg) applies it to every supplied tensor; callers
  // that load parameters themselves (a checkpoint, `--weights`) call it.
  Status check_finite(const std::string& origin) const;

  size_t size() const { return entries_.size(); }
  const Entry& operator[](size_t i) const { return entries_[i]; }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }

  const Tensor* find(const std::string& name) const;
  // The handle of a parameter (writing through it writes the shared storage); null if absent.
  Tensor* find(const std::string& name);
  // A defined tensor or an undefined one when absent: for optional parameters.
  Tensor get(const std::string& name) const;

  int64_t numel() const;       // scalars, all parameters together
  Parameters clone() const;    // owned, contiguous f32 copies
  Parameters zeros_like() const;
  void zero();                 // every tensor to 0 (gradients, between optimizer steps)

  Status save(const std::string& path) const;  // one safetensors file, in order

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace tessera
