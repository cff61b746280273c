// The schema behind config.h, privately: each key's KeySpec with the function that reads and checks
// its value and the one that prints it. The walker (loader.cpp) knows nothing of particular keys,
// so more keys (plugin options) are added by appending KeyRules. Not the YAML parser (node.h).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config/node.h"
#include "tessera/config.h"
#include "tessera/plugins.h"

namespace tessera::config {

// One entry of `plugins:` as written, its shape checked: what the resolve layer needs to find and
// load the plugin and then to check its options (read_plugin_options). The nodes belong to the
// tree that WalkContext::values keeps alive.
struct PluginRequest {
  std::string at;              // "plugins[0]"
  const Node* item = nullptr;  // the entry
  const Node* name = nullptr;
  const Node* path = nullptr;     // may be null
  const Node* options = nullptr;  // a mapping, null, or absent
  std::vector<std::string> dirs;  // `path` when it names a folder: searched first
  PluginConfig config;            // name, where, and file when `path` names the file
};

// The state of one validation walk over a merged tree.
struct WalkContext {
  Experiment* exp = nullptr;
  Diagnostics* diags = nullptr;
  Location root;                             // where a missing top-level key is reported
  std::map<std::string, std::string> dirs;   // file as in diagnostics -> absolute directory
  std::set<std::string> given;               // keys whose value was read without a problem
  std::set<std::string> bad;                 // keys with a problem: checks that need them are skipped
  std::map<std::string, NodePtr> values;     // key -> the value written for it
  std::vector<PluginRequest> plugin_requests;  // `plugins:`, for the resolve layer

  // Records a problem; `key` joins `bad`.
  void error(const Location& at, const std::string& key, std::string problem, std::string hint = "");
  void error(const Node& at, const std::string& key, std::string problem, std::string hint = "") {
    error(at.pos.location(), key, std::move(problem), std::move(hint));
  }
  Location where(const std::string& key) const;  // Experiment::where, else the file's start
  bool is_given(const std::string& key) const { return given.count(key) > 0; }
  bool is_bad(const std::string& key) const { return bad.count(key) > 0; }
  // The directory a relative path written in `n` is resolved against.
  std::string dir_of(const Node& n) const;
};

struct KeyRule {
  KeySpec spec;
  bool nullable = false;  // null stands for "not given" (keys whose default is none)
  bool open_map = false;  // a map of free names (model.weights.inline): a --set path ends here
  // Checks the written value and stores it in *c.exp; reports problems and returns false on any.
  // Empty for model.include, which the loader resolves before the walk.
  std::function<bool(const Node& value, const std::string& key, WalkContext& c)> read;
  // The resolved value as YAML: one line of flow style, or "\n"-led block lines to be indented.
  // Empty for model.include (a resolved experiment includes nothing).
  std::function<std::string(const Experiment& e)> print;
};

// Every key in schema order (the order of to_yaml and docs/CONFIG.md); sections are the prefixes
// of these paths.
const std::vector<KeyRule>& key_rules();

// After the walk and the resolve layer's work on the world: fills the defaults that depend on other
// keys, and reports missing required keys and inconsistent values.
void resolve(WalkContext& c);

// A plugin's options as written under `options:`, checked against the option list the loaded plugin
// declares (types, choices, required options), into pc->options in declared order with defaults
// filled in. Problems go to c with the option's key path; returns false on any.
bool read_plugin_options(const PluginRequest& q, const std::vector<PluginOptionSpec>& specs, WalkContext& c,
                         PluginConfig* pc);

// The sizes of a resolved model and their products within tessera/config.h's limits; `origin` names
// where the sizes came from when not the YAML ("/m/config.json sets it to "). False when refused.
bool check_model_sizes(const ModelConfig& m, WalkContext& c, const Location& at, const std::string& origin);

// How the whole load runs: the tree from the file (or string), the walk, then `world` (the resolve
// layer: plugins, Hugging Face folders), then resolve(). load_experiment in core/src/resolve/ passes
// its world; nullopt with diags on any problem.
using WorldStep = std::function<void(WalkContext& c)>;
std::optional<Experiment> load_file(const std::string& path, const LoadOptions& options, Diagnostics* diags,
                                    const WorldStep& world);
std::optional<Experiment> load_string(const std::string& yaml, const std::string& label,
                                      const std::string& base_dir, const LoadOptions& options,
                                      Diagnostics* diags, const WorldStep& world);

// Edit distance with transpositions (optimal string alignment), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate nearest to `word`, or "" when none is near enough to suggest.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace tessera::config
