// Which parameters a config asks for, and where each one's values come from: inline YAML, a
// safetensors file, or seeded initialisation — with every missing, unexpected or mis-shaped
// tensor reported together. It does not build layers (model.cpp does).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

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
  const bool tokens = c.stem.kind == StemKind::tokens || c.stem.kind == StemKind::mixed;
  const bool features = c.stem.kind == StemKind::features || c.stem.kind == StemKind::mixed;
  if (tokens) add("stem.embed", {c.stem.vocab_size, C}, I::matrix);
  if (tokens && c.stem.token_types > 0) add("stem.type_embed", {c.stem.token_types, C}, I::matrix);
  if (features) {
    add("stem.proj", {c.stem.n_features, C}, I::matrix);
    if (c.bias) add("stem.proj_bias", {C}, I::zeros);
    if (c.stem.cls) add("stem.cls", {C}, I::matrix);
    if (c.stem.cls && c.stem.dist) add("stem.dist", {C}, I::matrix);
  }
  if (c.stem.modalities > 0) add("stem.modality", {c.stem.modalities, C}, I::matrix);
  if (c.positions.kind == PositionKind::learned) add("pos.table", {c.positions.max_len, C}, I::matrix);
  if (c.stem.norm) {
    add("stem.norm.gamma", {C}, I::ones);
    add("stem.norm.beta", {C}, I::zeros);
  }
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
  const bool pooled = c.head.kind == HeadKind::pool || c.head.kind == HeadKind::classifier;
  if (pooled && c.head.pooler) {
    add("head.pooler.w", {C, C}, I::matrix);
    add("head.pooler.b", {C}, I::zeros);
  }
  if (pooled && c.head.norm) {
    add("head.norm.gamma", {C}, I::ones);
    add("head.norm.beta", {C}, I::zeros);
  }
  if (c.head.kind == HeadKind::lm && c.head.transform) {
    add("head.transform.w", {C, C}, I::matrix);
    add("head.transform.b", {C}, I::zeros);
    add("head.transform.gamma", {C}, I::ones);
    add("head.transform.beta", {C}, I::zeros);
  }
  if (c.head.kind == HeadKind::lm && c.head.tied && c.head.lm_bias) add("head.lm_bias", {c.stem.vocab_size}, I::zeros);
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

// A supplied tensor, where it came from (for messages) and under which key.
struct Supplied {
  Tensor value;
  Location where;
  std::string key;       // "model.weights.inline.<name>" or "model.weights.file"
  bool partial = false;  // assembled from some heads only: init fills the others
  std::string origin;    // " in <file>", " (<folder's tensor>)" or "" (inline): for messages
};

// What the inline YAML and the weights file supply, by parameter name.
struct Sources {
  std::map<std::string, Supplied> whole;
  std::map<std::string, std::map<int64_t, Supplied>> per_head;  // name -> head -> tensor
};

// Collects every supplied tensor and reports every problem with names, shapes and dtypes, each at
// the YAML key that chose the tensor. Reads the weights file's header, not its data.
Sources gather(const ModelConfig& cfg, const std::vector<ParamSpec>& specs, Diagnostics* diags) {
  std::map<std::string, const ParamSpec*> by_name;
  for (const auto& s : specs) by_name[s.name] = &s;
  const std::string& path = cfg.weights.file;
  const Location file_at = cfg.weights.file_where.file.empty() ? Location{path} : cfg.weights.file_where;
  const std::string in_file = " in " + path;
  const char* file_hint = "does the checkpoint match d_model, n_heads, d_k, d_v, d_ff and vocab_size?";
  Sources src;

  auto offer = [&](const std::string& name, const Tensor& t, const Location& at, const std::string& key,
                   const std::string& where_text, const std::string& origin) {
    std::string full;
    int64_t head = 0;
    if (!dtype_is_float(t.dtype())) {
      diags->add(at, key, "tensor \"" + name + "\"" + where_text + " is " + dtype_name(t.dtype()) +
                              "; parameters must be f32, bf16 or f16");
    } else if (by_name.count(name)) {
      if (!src.whole.count(name)) src.whole[name] = {t, at, key, false, origin};  // inline wins over the file
    } else if (parse_head_name(name, &full, &head) && by_name.count(full)) {
      if (head < 0 || head >= cfg.n_heads)
        diags->add(at, key, "tensor \"" + name + "\"" + where_text + ": head " + std::to_string(head) +
                                " does not exist (the model has n_heads = " + std::to_string(cfg.n_heads) + ")");
      else if (!src.per_head[full].count(head))
        src.per_head[full][head] = {t, at, key, false, origin};
    } else {
      diags->add(at, key, "unexpected tensor \"" + name + "\"" + where_text + ": the model has no parameter of that name",
                 "`tessera check --params` lists the model's parameters");
    }
  };

  for (const auto& [name, it] : cfg.weights.inline_tensors)
    offer(name, it.value, it.where.file.empty() ? Location{"<inline>"} : it.where, "model.weights.inline." + name, "", "");
  const Location folder_at = cfg.weights.file_where.file.empty() ? Location{cfg.path} : cfg.weights.file_where;
  for (const auto& [name, it] : cfg.weights.imported)
    offer(name, it.value, folder_at, "model.path", " (" + it.source + ")",
          " (from " + (std::filesystem::path(cfg.path) / it.source).string() + "; indices in the model's layout)");
  if (!path.empty()) {
    Result<safetensors::File> f = safetensors::File::open(path);
    if (!f.ok()) {
      diags->add(file_at, "model.weights.file", f.status().message());
      return src;
    }
    std::vector<bool> used(cfg.weights.ignore.size(), false);
    for (const auto& info : f->tensors()) {
      bool skip = false;
      for (size_t i = 0; i < cfg.weights.ignore.size(); ++i) {
        WeightsConfig one;
        one.ignore = {cfg.weights.ignore[i]};
        if (one.ignored(info.name)) used[i] = skip = true;
      }
      if (skip) continue;  // model.weights.ignore: not read, so neither unexpected nor mis-shaped
      Result<Tensor> t = f->get(info.name);
      if (!t.ok()) diags->add(file_at, "model.weights.file", t.status().message());
      else offer(info.name, t.value(), file_at, "model.weights.file", in_file, in_file);
    }
    const Location ignore_at = cfg.weights.ignore_where.file.empty() ? file_at : cfg.weights.ignore_where;
    for (size_t i = 0; i < used.size(); ++i)
      if (!used[i])
        diags->add(ignore_at, "model.weights.ignore",
                   "entry " + std::to_string(i) + ": \"" + cfg.weights.ignore[i] + "\" names none of the tensors" +
                       in_file,
                   "an entry is a tensor name or a prefix of one ending at a dot (head, head.transform, blocks.3)");
  }

  // Assemble per-head pieces into their full tensors (head h owns columns [h·D, (h+1)·D)). The
  // base is the whole tensor if one is given, else zeros; inline heads overlay a file's tensor.
  for (auto& [full, heads] : src.per_head) {
    const Supplied& first = heads.begin()->second;
    const ParamSpec& spec = *by_name[full];
    auto base = src.whole.find(full);
    const bool has_base = base != src.whole.end();
    if (has_base && base->second.value.shape() != spec.shape) continue;  // reported below
    const bool inline_base = has_base && base->second.key != "model.weights.file";
    const bool is_bias = spec.shape.rank() == 1;
    const int64_t D = spec.shape[spec.shape.rank() - 1] / cfg.n_heads;
    const Shape want = is_bias ? Shape{D} : Shape{spec.shape[0], D};
    Tensor assembled = has_base ? base->second.value.to(DType::f32) : Tensor::zeros(spec.shape);
    bool complete = has_base;
    for (int64_t h = 0; h < cfg.n_heads; ++h) {
      const std::string dot = full.substr(full.rfind('.'));
      const std::string head_name = full.substr(0, full.rfind('.')) + ".head" + std::to_string(h) + dot;
      auto it = heads.find(h);
      if (it == heads.end()) {
        if (!has_base && !cfg.weights.allow_missing)
          diags->add(first.where, first.key, "missing tensor \"" + head_name + "\" " + want.str() +
                                                 " (the other heads of \"" + full + "\" are given)",
                     "give every head, or set model.weights.allow_missing: true");
        continue;
      }
      const bool inline_head = it->second.key != "model.weights.file";
      if (inline_base && inline_head) {
        diags->add(it->second.where, it->second.key, "\"" + full + "\" is given both whole and per head",
                   "give one or the other");
        continue;
      }
      if (inline_base) continue;  // the inline whole tensor wins over the file's heads
      if (it->second.value.shape() != want) {
        diags->add(it->second.where, it->second.key, "tensor \"" + head_name + "\" has shape " +
                                                         it->second.value.shape().str() + " but the model expects " +
                                                         want.str());
        continue;
      }
      (is_bias ? assembled.slice(0, h * D, (h + 1) * D) : assembled.slice(1, h * D, (h + 1) * D))
          .copy_from(it->second.value);
    }
    if (!complete) complete = static_cast<int64_t>(heads.size()) == cfg.n_heads;
    src.whole[full] = {assembled, first.where, first.key, !complete, first.origin};
  }

  for (const auto& s : specs) {
    auto it = src.whole.find(s.name);
    if (it == src.whole.end()) {
      if (!cfg.weights.allow_missing)
        diags->add(path.empty() ? Location{"<weights>"} : file_at, path.empty() ? "model.weights" : "model.weights.file",
                   "missing tensor \"" + s.name + "\" " + s.shape.str() + (path.empty() ? "" : in_file),
                   "set model.weights.allow_missing: true to initialise missing tensors");
    } else if (it->second.value.shape() != s.shape && !it->second.partial) {
      const bool from_file = it->second.key == "model.weights.file";
      diags->add(it->second.where, it->second.key,
                 "tensor \"" + s.name + "\"" + (from_file ? in_file : "") + " has shape " +
                     it->second.value.shape().str() + " but the model expects " + s.shape.str(),
                 from_file ? file_hint : "");
    }
  }
  return src;
}

}  // namespace

Result<std::vector<std::pair<std::string, Tensor>>> resolve_parameters(const ModelConfig& cfg) {
  const std::vector<ParamSpec> specs = parameter_specs(cfg);
  Diagnostics diags;
  Sources src = gather(cfg, specs, &diags);
  if (!diags.empty())
    return Status::Invalid(std::to_string(diags.size()) + " problem(s) with the model's weights:\n" + diags.str());
  // Every supplied value must be finite: a NaN in a weight is otherwise absorbed silently into
  // every output it touches. One pass at memory speed over what the layers read anyway; the
  // tensors are shared out among the threads (each one's scan is serial: most are under 4M values).
  std::vector<const std::pair<const std::string, Supplied>*> supplied;
  for (const auto& e : src.whole) supplied.push_back(&e);
  std::vector<std::string> problems(supplied.size());
  const auto n_supplied = static_cast<int64_t>(supplied.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < n_supplied; ++i) {
    const auto& [name, sup] = *supplied[static_cast<size_t>(i)];
    problems[static_cast<size_t>(i)] = nonfinite_problem(name, sup.origin, sup.value);
  }
  for (size_t i = 0; i < supplied.size(); ++i)
    if (!problems[i].empty()) diags.add(supplied[i]->second.where, supplied[i]->second.key, problems[i]);
  if (!diags.empty())
    return Status::Invalid(std::to_string(diags.size()) + " tensor(s) of the model's weights hold NaN or infinite "
                           "values:\n" + diags.str() + "\n  " + kNonFiniteWeightsHint);

  // Seeded init draws every matrix in spec order whenever anything is initialised, so a tensor's
  // initial values never depend on which other tensors were supplied.
  bool need_init = false;
  for (const auto& s : specs) {
    auto it = src.whole.find(s.name);
    need_init = need_init || it == src.whole.end() || it->second.partial;
  }
  Rng rng(cfg.init.seed);
  std::vector<std::pair<std::string, Tensor>> params;
  params.reserve(specs.size());
  for (const auto& s : specs) {
    auto it = src.whole.find(s.name);
    Tensor t;
    if (need_init) {
      t = Tensor::empty(s.shape);
      init_parameter(s, cfg.init, rng, t);
    }
    if (it != src.whole.end() && !it->second.partial) {
      t = it->second.value;  // zero-copy when it comes from the file
    } else if (it != src.whole.end()) {
      const bool is_bias = s.shape.rank() == 1;
      const int64_t D = s.shape[s.shape.rank() - 1] / cfg.n_heads;
      for (const auto& [h, sup] : src.per_head[s.name])
        (is_bias ? t.slice(0, h * D, (h + 1) * D) : t.slice(1, h * D, (h + 1) * D)).copy_from(sup.value);
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

void validate_weights(const ModelConfig& cfg, Diagnostics* diags) {
  model::gather(cfg, parameter_specs(cfg), diags);
}

}  // namespace tessera
