// Parameters: named tensors with a name index; resolution lives in weights.cpp.
#include "tessera/parameters.h"

#include <cstring>

#include "tessera/model.h"
#include "tessera/safetensors.h"
#include "weights.h"

namespace tessera {

Parameters::Parameters(std::vector<Entry> entries) : entries_(std::move(entries)) {
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
}

Result<Parameters> Parameters::resolve(const ModelConfig& cfg) {
  auto r = model::resolve_parameters(cfg);
  if (!r.ok()) return r.status();
  return Parameters(std::move(r).value());
}

Status Parameters::check(const ModelConfig& cfg) const {
  std::string problems;
  int n = 0;
  auto add = [&](const std::string& m) {
    problems += "\n  " + m;
    ++n;
  };
  const std::vector<ParamSpec> specs = parameter_specs(cfg);
  std::unordered_map<std::string, const ParamSpec*> want;
  for (const auto& s : specs) want.emplace(s.name, &s);
  for (const auto& s : specs) {
    const Tensor* t = find(s.name);
    if (!t) add("missing tensor \"" + s.name + "\" " + s.shape.str());
    else if (t->shape() != s.shape)
      add("tensor \"" + s.name + "\" has shape " + t->shape().str() + " but the model expects " + s.shape.str());
    else if (!dtype_is_float(t->dtype()))
      add("tensor \"" + s.name + "\" is " + dtype_name(t->dtype()) + "; parameters are floating point");
  }
  for (const auto& [name, t] : entries_)
    if (!want.count(name)) add("unexpected tensor \"" + name + "\" (the config asks for no such parameter)");
  if (n == 0) return Status::Ok();
  return Status::Invalid(std::to_string(n) + " problem(s) with the model's parameters:" + problems);
}

const Tensor* Parameters::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

Tensor* Parameters::find(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

Tensor Parameters::get(const std::string& name) const {
  const Tensor* t = find(name);
  return t ? *t : Tensor();
}

int64_t Parameters::numel() const {
  int64_t n = 0;
  for (const auto& [name, t] : entries_) n += t.numel();
  return n;
}

Parameters Parameters::clone() const {
  std::vector<Entry> out;
  out.reserve(entries_.size());
  for (const auto& [name, t] : entries_) out.emplace_back(name, t.dtype() == DType::f32 ? t.clone() : t.to(DType::f32));
  return Parameters(std::move(out));
}

Parameters Parameters::zeros_like() const {
  std::vector<Entry> out;
  out.reserve(entries_.size());
  for (const auto& [name, t] : entries_) out.emplace_back(name, Tensor::zeros(t.shape()));
  return Parameters(std::move(out));
}

void Parameters::zero() {
  for (auto& [name, t] : entries_) {
    if (t.is_contiguous()) {
      std::memset(t.raw_data(), 0, t.nbytes());
    } else {
      t.copy_from(Tensor::zeros(t.shape(), t.dtype()));
    }
  }
}

Status Parameters::save(const std::string& path) const { return safetensors::write(path, entries_); }

}  // namespace tessera
