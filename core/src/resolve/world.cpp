// The resolve layer: a config that the config layer has parsed and validated, resolved against the
// world it names: plugins found on the search path and loaded (their options checked against what
// each declares), Hugging Face folders imported. load_experiment runs the config layer's load with
// this step between its walk and its rules across keys (DESIGN.md: "the config layer parses and
// validates; resolving a config against the world is a layer above it"). Not the YAML, not the schema.
#include <algorithm>
#include <functional>
#include <set>
#include <sstream>

#include "config/schema.h"
#include "tessera/config.h"
#include "tessera/hf.h"
#include "tessera/model.h"
#include "tessera/plugins.h"
#include "tessera/random.h"

namespace tessera {
namespace {

using config::PluginRequest;
using config::WalkContext;

// Each entry of `plugins:`: its library found (a `path` file, else the search path with a `path`
// folder first) and loaded, its name checked, its options read against the plugin's own list. On
// any problem `plugins` counts as bad and the experiment has none (as when the entry itself is
// malformed), so that checks needing the plugins stay quiet.
void load_plugins(WalkContext& c) {
  if (c.plugin_requests.empty()) return;
  bool ok = true;
  std::vector<PluginConfig> out;
  for (PluginRequest& q : c.plugin_requests) {
    PluginConfig pc = q.config;
    const std::string& at = q.at;
    std::string file = pc.file;
    if (file.empty()) {
      Result<std::string> found = find_plugin(pc.name, q.dirs);
      if (!found.ok()) {
        c.error(*q.name, at + ".name", found.status().message());
        ok = false;
        continue;
      }
      file = *found;
    }
    Result<std::shared_ptr<const Plugin>> plugin = Plugin::load(file);
    if (!plugin.ok()) {
      c.error(q.path ? *q.path : *q.name, at + (q.path ? ".path" : ".name"), plugin.status().message());
      ok = false;
      continue;
    }
    if ((*plugin)->name() != pc.name) {
      c.error(*q.name, at + ".name",
              file + " is plugin \"" + (*plugin)->name() + "\", not \"" + pc.name + "\"");
      ok = false;
      continue;
    }
    pc.file = file;
    if (!config::read_plugin_options(q, (*plugin)->options(), c, &pc)) {
      ok = false;
      continue;
    }
    out.push_back(std::move(pc));
  }
  if (ok && !c.is_bad("plugins")) {
    c.exp->plugins = std::move(out);
  } else {
    c.given.erase("plugins");
    c.bad.insert("plugins");
  }
}

// model.from: hf: the folder's config.json and weights become the model; the name, dtype, init and
// head keys written beside it override what the folder says (config's check_hf_keys refuses the
// others). The experiment's plugin of the folder's modality gets the folder's options (vocabulary,
// image size, mean and std, mel settings) unless the YAML sets them; with no plugins written, the
// folder's plugin is found on the search path.
void import_hf_model(WalkContext& c) {
  ModelConfig& m = c.exp->model;
  if (m.source != ModelSource::hf || !c.exp->locations.count("model") || !c.is_given("model.path")) return;
  hf::ImportOptions opt;
  for (const PluginConfig& pc : c.exp->plugins)
    if (pc.name == "image" && pc.option_where.count("image_size"))
      for (const auto& [k, v] : pc.options)
        if (k == "image_size") {
          std::stringstream ss(v);
          for (std::string x; std::getline(ss, x, ',');) opt.image_size.push_back(std::stoll(x));
          if (opt.image_size.size() == 1) opt.image_size.push_back(opt.image_size[0]);
        }
  Diagnostics d;
  std::optional<hf::Folder> f = hf::import_folder(m.path, opt, c.where("model.path"), &d);
  for (const Diagnostic& x : d.items()) c.error(x.where, x.key, x.problem, x.hint);
  if (!f) return;
  // The folder's sizes have not been through the keys' bounds; a model too large for 64-bit sizes
  // is refused before any of its tensors is shaped.
  if (!config::check_model_sizes(f->model, c, c.where("model.path"), m.path + "/config.json sets it to "))
    return;
  ModelConfig user = m;
  m = f->model;
  if (c.is_given("model.name")) m.name = user.name;
  if (c.is_given("model.dtype")) m.dtype = user.dtype;
  m.init = user.init;  // seeds a new head (below); the folder's own tensors are never initialised
  const bool kind_changed = c.is_given("model.head.kind") && user.head.kind != m.head.kind;
  if (kind_changed) {  // keep what still fits the new head: the pooling and pooler of a pooled head
    const HeadConfig was = m.head;
    const bool pooled_before = was.kind == HeadKind::pool || was.kind == HeadKind::classifier;
    m.head = HeadConfig{};
    m.head.kind = user.head.kind;
    m.head.pool = pooled_before ? was.pool : m.causal ? PoolKind::last : PoolKind::mean;
    m.head.pooler = pooled_before && was.pooler;
    m.head.normalize = was.normalize;
  }
#define TSR_HEAD_KEY(field) \
  if (c.is_given("model.head." #field)) m.head.field = user.head.field;
  TSR_HEAD_KEY(pool)
  TSR_HEAD_KEY(normalize)
  TSR_HEAD_KEY(n_classes)
  TSR_HEAD_KEY(labels)
  TSR_HEAD_KEY(tied)
  TSR_HEAD_KEY(lm_bias)
  TSR_HEAD_KEY(pooler)
  TSR_HEAD_KEY(norm)
  TSR_HEAD_KEY(transform)
#undef TSR_HEAD_KEY
  m.notes = f->notes;
  // Tensors of a head the YAML replaced (a classifier's, when head.kind is pool) are left out.
  std::set<std::string> wanted;
  for (const ParamSpec& p : parameter_specs(m)) wanted.insert(p.name);
  for (auto it = m.weights.imported.begin(); it != m.weights.imported.end();) {
    if (wanted.count(it->first)) {
      ++it;
      continue;
    }
    m.notes.push_back(it->second.source + " is not used by the head the YAML chose");
    it = m.weights.imported.erase(it);
  }
  // A head the folder does not have (fine-tuning a new classifier): its tensors are drawn from
  // model.init (seeded per tensor name), biases zero. Only head tensors: a folder that lacks any
  // other tensor is still refused.
  for (const ParamSpec& p : parameter_specs(m)) {
    if (p.name.rfind("head.", 0) != 0 || m.weights.imported.count(p.name)) continue;
    Tensor t = Tensor::zeros(p.shape);
    if (p.init == ParamSpec::Init::ones) t = Tensor::full(p.shape, 1.f);
    if (p.init == ParamSpec::Init::matrix) {
      Rng rng(m.init.seed ^ std::hash<std::string>{}(p.name));
      Tensor w = p.shape.rank() == 1 ? t.reshape({1, p.shape[0]}) : t;
      init_matrix(w, m.init.scheme, m.init.std, rng);
    }
    m.weights.imported[p.name] = {
        t, "initialised (model.init, seed " + std::to_string(m.init.seed) + "): the folder has no " + p.name};
    m.notes.push_back(p.name + " " + p.shape.str() + ": not in the folder, initialised for training");
  }
  if (!c.is_given("plugins") && !c.is_bad("plugins") && !f->plugin.empty()) {
    // No plugins written: the folder's modality plugin, found on the search path.
    Result<std::string> found = find_plugin(f->plugin, {});
    Result<std::shared_ptr<const Plugin>> plugin =
        found.ok() ? Plugin::load(*found) : Result<std::shared_ptr<const Plugin>>(found.status());
    if (!plugin.ok()) {
      c.error(c.where("model.path"), "plugins",
              "the folder's inputs need the " + f->plugin + " plugin: " + plugin.status().message(),
              "install it, or list the plugins under `plugins:`");
    } else {
      PluginConfig pc;
      pc.name = f->plugin;
      pc.file = *found;
      pc.where = c.where("model.path");
      for (const PluginOptionSpec& o : (*plugin)->options())
        if (o.default_value) {
          pc.options.emplace_back(o.name, *o.default_value);
          pc.option_types.push_back(o.type);
        }
      c.exp->plugins.push_back(std::move(pc));
      m.notes.push_back("plugin " + f->plugin + " added with the folder's options (no `plugins:` written)");
    }
  }
  for (PluginConfig& pc : c.exp->plugins) {
    if (pc.name != f->plugin) continue;
    for (const auto& [k, v] : f->plugin_options) {
      if (pc.option_where.count(k)) continue;  // the YAML's own choice wins
      for (auto& [name, value] : pc.options)
        if (name == k) value = v;
    }
  }
}

// Between the config layer's walk and its rules across keys (which need the imported model).
void resolve_world(WalkContext& c) {
  load_plugins(c);
  import_hf_model(c);
}

}  // namespace

std::optional<Experiment> load_experiment(const std::string& path, const LoadOptions& options,
                                          Diagnostics* diags) {
  return config::load_file(path, options, diags, resolve_world);
}

std::optional<Experiment> load_experiment_from_string(const std::string& yaml, const std::string& label,
                                                      const std::string& base_dir, const LoadOptions& options,
                                                      Diagnostics* diags) {
  return config::load_string(yaml, label, base_dir, options, diags, resolve_world);
}

}  // namespace tessera
