// Which parameters a config asks for, and where each one's values come from: inline YAML, a
// safetensors file, or seeded initialisation — with every missing, unexpected or mis-shaped
// tensor reported together. It does not build layers (model.cpp does).
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "tessera/model.h"
#include "tessera/random.h"
#include "tessera/safetensors.h"
#include "weights.h"

namespace tessera {

std::vector<ParamSpec> parameter_specs(const ModelConfig& c) {
  using I = ParamSpec::Init;
  std::vector<ParamSpec> s;
  auto add = [&](std::string name, Shape shape, I init, int64_t head_cols = 0) {
    s.push_back({std::move(name), shape, init, head_cols});
  };
  const int64_t C = c.d_model, H = c.n_heads;
  switch (c.stem.kind) {
    case StemKind::tokens: add("stem.embed", {c.stem.vocab_size, C}, I::matrix); break;
    case StemKind::features:
      add("stem.proj", {c.stem.n_features, C}, I::matrix);
      if (c.bias) add("stem.proj_bias", {C}, I::zeros);
      if (c.stem.cls) add("stem.cls", {C}, I::matrix);
      break;
    case StemKind::identity: break;
  }
  if (c.positions.kind == PositionKind::learned) add("pos.table", {c.positions.max_len, C}, I::matrix);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    // Drawn head by head, W_Q heads first, then W_K, W_V, W_O: the order of the seeds' NumPy code.
    add(b + "attn.w_q", {C, H * c.d_k}, I::matrix, c.d_k);
    if (c.bias) add(b + "attn.b_q", {H * c.d_k}, I::zeros);
    add(b + "attn.w_k", {C, H * c.d_k}, I::matrix, c.d_k);
    if (c.bias) add(b + "attn.b_k", {H * c.d_k}, I::zeros);
    add(b + "attn.w_v", {C, H * c.d_v}, I::matrix, c.d_v);
    if (c.bias) add(b + "attn.b_v", {H * c.d_v}, I::zeros);
    if (c.attention.output_projection) {
      add(b + "attn.w_o", {H * c.d_v, C}, I::matrix);
      if (c.bias) add(b + "attn.b_o", {C}, I::zeros);
    }
    if (c.positions.kind == PositionKind::relative) {
      const int64_t R = 2 * c.positions.max_distance + 1;
      add(b + "attn.rel_k", {R, c.d_k}, I::matrix);
      add(b + "attn.rel_v", {R, c.d_v}, I::matrix);
    }
    if (c.norm != NormPlacement::none) {
      add(b + "ln1.gamma", {C}, I::ones);
      add(b + "ln1.beta", {C}, I::zeros);
    }
    if (c.d_ff > 0) {
      add(b + "ffn.w1", {C, c.d_ff}, I::matrix);
      if (c.bias) add(b + "ffn.b1", {c.d_ff}, I::zeros);
      add(b + "ffn.w2", {c.d_ff, C}, I::matrix);
      if (c.bias) add(b + "ffn.b2", {C}, I::zeros);
      if (c.norm != NormPlacement::none) {
        add(b + "ln2.gamma", {C}, I::ones);
        add(b + "ln2.beta", {C}, I::zeros);
      }
    }
  }
  if (c.final_norm) {
    add("final_norm.gamma", {C}, I::ones);
    add("final_norm.beta", {C}, I::zeros);
  }
  if (c.head.kind == HeadKind::classifier) {
    add("head.w", {C, c.head.n_classes}, I::matrix);
    if (c.bias) add("head.b", {c.head.n_classes}, I::zeros);
  }
  if (c.head.kind == HeadKind::lm && !c.head.tied) {
    add("head.lm", {C, c.stem.vocab_size}, I::matrix);
    if (c.bias) add("head.lm_bias", {c.stem.vocab_size}, I::zeros);
  }
  return s;
}

namespace model {

namespace {

// "blocks.3.attn.head1.w_q" -> ("blocks.3.attn.w_q", 1); false for any other name.
bool parse_head_name(const std::string& name, std::string* full, int64_t* head) {
  const auto pos = name.find(".attn.head");
  if (pos == std::string::npos) return false;
  const size_t digits = pos + 10;
  size_t end = digits;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == digits || end >= name.size() || name[end] != '.') return false;
  const std::string leaf = name.substr(end + 1);
  if (leaf != "w_q" && leaf != "w_k" && leaf != "w_v" && leaf != "b_q" && leaf != "b_k" && leaf != "b_v")
    return false;
  *full = name.substr(0, pos) + ".attn." + leaf;
  *head = std::stoll(name.substr(digits, end - digits));
  return true;
}

std::string where_str(const Location& w) {
  if (w.file.empty()) return "";
  std::ostringstream os;
  os << w.file;
  if (w.line > 0) os << ":" << w.line << ":" << w.col;
  return os.str();
}

// A supplied tensor and where it came from, for messages.
struct Supplied {
  Tensor value;
  std::string source;    // "model.yaml:12:7 (inline)" or "w.safetensors"
  bool partial = false;  // assembled from some heads only: init fills the others
};

}  // namespace

Result<std::vector<std::pair<std::string, Tensor>>> resolve_parameters(const ModelConfig& cfg) {
  const std::vector<ParamSpec> specs = parameter_specs(cfg);
  std::map<std::string, const ParamSpec*> by_name;
  for (const auto& s : specs) by_name[s.name] = &s;

  std::vector<std::string> problems;
  std::map<std::string, Supplied> whole;                                  // name -> tensor
  std::map<std::string, std::map<int64_t, Supplied>> per_head;            // name -> head -> tensor

  auto offer = [&](const std::string& name, const Tensor& t, const std::string& source) {
    std::string full;
    int64_t head = 0;
    if (by_name.count(name)) {
      if (!whole.count(name)) whole[name] = {t, source};  // inline wins over the file
    } else if (parse_head_name(name, &full, &head) && by_name.count(full)) {
      if (head < 0 || head >= cfg.n_heads)
        problems.push_back(source + ": tensor \"" + name + "\": head " + std::to_string(head) +
                           " does not exist (the model has n_heads = " + std::to_string(cfg.n_heads) + ")");
      else if (!per_head[full].count(head)) per_head[full][head] = {t, source};
    } else {
      problems.push_back(source + ": unexpected tensor \"" + name +
                         "\": the model has no parameter of that name (see `tessera check` for the list)");
    }
  };

  for (const auto& [name, it] : cfg.weights.inline_tensors)
    offer(name, it.value, where_str(it.where) + " (inline)");

  std::shared_ptr<safetensors::File> file;
  if (!cfg.weights.file.empty()) {
    Result<safetensors::File> f = safetensors::File::open(cfg.weights.file);
    if (!f.ok()) return f.status();
    file = std::make_shared<safetensors::File>(std::move(f).value());
    for (const auto& info : file->tensors()) {
      Result<Tensor> t = file->get(info.name);
      if (!t.ok()) {
        problems.push_back(t.status().message());
        continue;
      }
      offer(info.name, t.value(), cfg.weights.file);
    }
  }

  // Assemble per-head pieces into their full tensors (columns [h·D, (h+1)·D)).
  for (auto& [full, heads] : per_head) {
    if (whole.count(full)) {
      problems.push_back(heads.begin()->second.source + ": \"" + full +
                         "\" is given both whole and per head; give one or the other");
      continue;
    }
    const ParamSpec& spec = *by_name[full];
    const bool is_bias = spec.shape.rank() == 1;
    const int64_t D = spec.shape[spec.shape.rank() - 1] / cfg.n_heads;
    const Shape want = is_bias ? Shape{D} : Shape{spec.shape[0], D};
    Tensor assembled = Tensor::zeros(spec.shape);
    bool complete = true;
    for (int64_t h = 0; h < cfg.n_heads; ++h) {
      auto it = heads.find(h);
      const std::string head_name = full.substr(0, full.rfind('.')) + ".head" + std::to_string(h) +
                                    full.substr(full.rfind('.'));
      if (it == heads.end()) {
        complete = false;
        if (!cfg.weights.allow_missing)
          problems.push_back("missing tensor \"" + head_name + "\" " + want.str() +
                             " (the other heads of \"" + full + "\" are given)");
        continue;
      }
      if (it->second.value.shape() != want) {
        problems.push_back(it->second.source + ": tensor \"" + head_name + "\" has shape " +
                           it->second.value.shape().str() + " but the model expects " + want.str());
        continue;
      }
      Tensor dst = is_bias ? assembled.slice(0, h * D, (h + 1) * D)
                           : assembled.slice(1, h * D, (h + 1) * D);
      dst.copy_from(it->second.value);
    }
    whole[full] = {assembled, heads.begin()->second.source, !complete};
  }

  for (const auto& s : specs) {
    auto it = whole.find(s.name);
    if (it == whole.end()) {
      if (!cfg.weights.allow_missing)
        problems.push_back("missing tensor \"" + s.name + "\" " + s.shape.str() +
                           (cfg.weights.file.empty() ? "" : " in " + cfg.weights.file));
      continue;
    }
    if (it->second.value.shape() != s.shape)
      problems.push_back(it->second.source + ": tensor \"" + s.name + "\" has shape " +
                         it->second.value.shape().str() + " but the model expects " + s.shape.str());
    else if (!dtype_is_float(it->second.value.dtype()))
      problems.push_back(it->second.source + ": tensor \"" + s.name + "\" is " +
                         dtype_name(it->second.value.dtype()) + "; parameters must be f32, bf16 or f16");
  }
  if (!problems.empty()) {
    std::string msg = std::to_string(problems.size()) + " problem(s) with the model's weights:";
    for (const auto& p : problems) msg += "\n  " + p;
    return Status::Invalid(msg);
  }

  // Seeded init draws every matrix in spec order whenever anything is initialised, so a tensor's
  // initial values never depend on which other tensors were supplied.
  bool need_init = false;
  for (const auto& s : specs) {
    auto it = whole.find(s.name);
    need_init = need_init || it == whole.end() || it->second.partial;
  }
  Rng rng(cfg.init.seed);
  std::vector<std::pair<std::string, Tensor>> params;
  params.reserve(specs.size());
  for (const auto& s : specs) {
    auto it = whole.find(s.name);
    const bool partial = it != whole.end() && it->second.partial;
    Tensor t;
    if (need_init) {
      t = Tensor::empty(s.shape);
      init_parameter(s, cfg.init, rng, t);
    }
    if (it != whole.end() && !partial) {
      t = it->second.value;  // zero-copy when it comes from the file
    } else if (partial) {
      const auto& heads = per_head[s.name];
      const bool is_bias = s.shape.rank() == 1;
      const int64_t D = s.shape[s.shape.rank() - 1] / cfg.n_heads;
      for (const auto& [h, sup] : heads) {
        Tensor dst = is_bias ? t.slice(0, h * D, (h + 1) * D) : t.slice(1, h * D, (h + 1) * D);
        dst.copy_from(sup.value);
      }
    }
    params.emplace_back(s.name, t);
  }
  return params;
}

void init_parameter(const ParamSpec& s, const InitConfig& init, Rng& rng, Tensor& t) {
  using I = ParamSpec::Init;
  if (s.init == I::zeros || s.init == I::ones) {
    float* p = t.data<float>();
    std::fill(p, p + t.numel(), s.init == I::ones ? 1.f : 0.f);
    return;
  }
  Tensor m = t.rank() == 1 ? t.reshape({1, t.dim(0)}) : t;
  if (s.head_cols > 0) {  // one draw per head, sized by the head's own (rows, cols)
    for (int64_t c0 = 0; c0 < m.dim(1); c0 += s.head_cols) {
      Tensor block = Tensor::empty({m.dim(0), s.head_cols});
      init_matrix(block, init.scheme, init.std, rng);
      m.slice(1, c0, c0 + s.head_cols).copy_from(block);
    }
  } else {
    init_matrix(m, init.scheme, init.std, rng);
  }
}

}  // namespace model
}  // namespace tessera
