// The config layer's load: file -> tree (yaml_parse.cpp) -> --set overrides -> model.include -> a
// walk of the tree against the schema (schema.cpp) -> the resolve layer's step (plugins, Hugging
// Face folders: core/src/resolve/world.cpp, which holds load_experiment) -> the rules across keys.
// Also Diagnostic(s) and Experiment::where. The walk is generic: it knows sections and rules, never
// a particular key; nothing here loads a plugin or reads a model folder.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "config/node.h"
#include "config/schema.h"

namespace tessera {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Diagnostics.

std::string Diagnostic::str() const {
  std::string s = where.file;
  if (where.line > 0) {
    s += ":" + std::to_string(where.line) + ":" + std::to_string(where.col);
  } else if (where.col > 0) {  // a place in a command-line argument
    s += ", column " + std::to_string(where.col);
  }
  s += ": ";
  if (!key.empty()) s += key + ": ";
  s += problem;
  if (!hint.empty()) s += " (" + hint + ")";
  return s;
}

void Diagnostics::add(Location where, std::string key, std::string problem, std::string hint) {
  items_.push_back({std::move(where), std::move(key), std::move(problem), std::move(hint)});
}

std::string Diagnostics::str() const {
  std::vector<const Diagnostic*> sorted;
  for (const Diagnostic& d : items_) sorted.push_back(&d);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Diagnostic* a, const Diagnostic* b) {
    if (a->where.file != b->where.file) return a->where.file < b->where.file;
    if (a->where.line != b->where.line) return a->where.line < b->where.line;
    return a->where.col < b->where.col;
  });
  std::string out;
  for (const Diagnostic* d : sorted) out += (out.empty() ? "" : "\n") + d->str();
  return out;
}

namespace {

// The location of `key` or of its nearest written ancestor ("a.b.c", "a.b", "a"), or nullptr.
const Location* nearest_written(const std::map<std::string, Location>& locations, std::string key) {
  for (;;) {
    auto it = locations.find(key);
    if (it != locations.end()) return &it->second;
    const size_t dot = key.rfind('.');
    if (dot == std::string::npos) return nullptr;
    key.resize(dot);
  }
}

}  // namespace

Location Experiment::where(const std::string& key) const {
  const Location* at = nearest_written(locations, key);
  return at ? *at : Location{file, 0, 0};
}

namespace config {

void WalkContext::error(const Location& at, const std::string& key, std::string problem, std::string hint) {
  diags->add(at, key, std::move(problem), std::move(hint));
  bad.insert(key);
}

Location WalkContext::where(const std::string& key) const {
  const Location* at = nearest_written(exp->locations, key);
  return at ? *at : root;
}

std::string WalkContext::dir_of(const Node& n) const {
  auto it = n.pos.file ? dirs.find(*n.pos.file) : dirs.end();
  return it != dirs.end() ? it->second : fs::current_path().string();
}

namespace {

constexpr int kMaxIncludeDepth = 8;
constexpr const char* kSetPrefix = "--set ";  // an override's place is "--set " + the argument

// The schema seen as a tree: rules by path, and the children of every section ("" is the top).
struct SchemaIndex {
  std::unordered_map<std::string, const KeyRule*> rules;
  std::map<std::string, std::vector<std::string>> children;
  std::vector<std::vector<std::string>> open_maps;  // paths of open-map rules, split
};

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

const SchemaIndex& schema_index() {
  static const SchemaIndex index = [] {
    SchemaIndex ix;
    for (const KeyRule& r : key_rules()) {
      ix.rules[r.spec.path] = &r;
      const std::vector<std::string> parts = split_path(r.spec.path);
      std::string section;
      for (const std::string& part : parts) {
        std::vector<std::string>& kids = ix.children[section];
        if (std::find(kids.begin(), kids.end(), part) == kids.end()) kids.push_back(part);
        section += (section.empty() ? "" : ".") + part;
      }
      if (r.open_map) ix.open_maps.push_back(parts);
    }
    return ix;
  }();
  return index;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

void report_unknown_key(const MapEntry& e, const std::string& path, const std::string& section, WalkContext& c) {
  const SchemaIndex& ix = schema_index();
  const std::vector<std::string>& siblings = ix.children.at(section);
  std::string hint;
  std::string near = nearest(e.key, siblings);
  if (!near.empty()) {
    hint = "did you mean `" + near + "`?";
  } else {
    // The same name in another section of the same top-level key: `model.max_len`.
    const std::string top = split_path(path)[0];
    for (const KeyRule& r : key_rules()) {
      const std::vector<std::string> parts = split_path(r.spec.path);
      if (parts.back() == e.key && parts[0] == top) {
        hint = "did you mean `" + r.spec.path + "`?";
        break;
      }
    }
  }
  if (hint.empty()) {
    hint = (section.empty() ? std::string("valid top-level keys: ") : "valid keys in " + section + ": ") +
           join(siblings, ", ");
  }
  c.error(e.key_pos.location(), path, "unknown key", hint);
}

void walk_map(const Node& map, const std::string& section, WalkContext& c) {
  const SchemaIndex& ix = schema_index();
  for (const MapEntry& e : map.entries) {
    const std::string path = section.empty() ? e.key : section + "." + e.key;
    const Node& value = *e.value;
    auto rule = ix.rules.find(path);
    if (rule != ix.rules.end()) {
      c.exp->locations[path] = e.key_pos.location();
      c.values[path] = e.value;
      const KeyRule& r = *rule->second;
      if (!r.read || (value.is_null() && r.nullable)) continue;
      if (r.read(value, path, c)) {
        c.given.insert(path);
      } else {
        c.bad.insert(path);
      }
    } else if (ix.children.count(path)) {
      c.exp->locations[path] = e.key_pos.location();
      if (value.is_map()) {
        walk_map(value, path, c);
      } else if (!value.is_null()) {  // `runtime:` with nothing under it is an empty section
        c.error(value, path, "expected a mapping, found " + describe(value));
      }
    } else {
      report_unknown_key(e, path, section, c);
    }
  }
}

bool size_ok(uintmax_t size, size_t max_bytes, std::string* why) {
  if (size <= max_bytes) return true;
  *why = "the file is " + std::to_string(size) + " bytes, more than max_file_bytes (" + std::to_string(max_bytes) + ")";
  return false;
}

// Reads a whole file, refusing one larger than max_bytes before reading it; on failure says why.
bool read_file(const std::string& path, size_t max_bytes, std::string* text, std::string* why) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    *why = std::strerror(ENOENT);
    return false;
  }
  if (!fs::is_regular_file(st)) {
    *why = "not a regular file";
    return false;
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec && !size_ok(size, max_bytes, why)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *why = std::strerror(errno);
    return false;
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  *text = buf.str();
  return size_ok(text->size(), max_bytes, why);
}

class Loader {
 public:
  Loader(const LoadOptions& options, Diagnostics* diags, WalkContext* c)
      : options_(options), diags_(diags), c_(c) {
    limits_.max_depth = options.max_depth;
    limits_.max_nodes = options.max_nodes;
  }

  // Registers a file: its name in messages, and the directories its relative paths start from.
  void add_file(const std::string& shown, const std::string& shown_dir, const fs::path& abs_dir) {
    shown_dirs_[shown] = shown_dir;
    c_->dirs[shown] = abs_dir.lexically_normal().string();
  }

  NodePtr parse(const std::string& text, const std::string& shown, const SrcPos* fixed = nullptr) {
    return parse_yaml(text, shown, limits_, diags_, fixed);
  }

  // --set key.path=value, in order. Each one's place is the pseudo-file "--set key.path=value",
  // line 0, and the column in the argument: of each key of the path, and of the value's nodes.
  NodePtr apply_overrides(NodePtr root) {
    for (const std::string& text : options_.overrides) {
      const std::string shown = kSetPrefix + text;
      add_file(shown, "", fs::current_path());
      auto file = std::make_shared<const std::string>(shown);
      const size_t eq = text.find('=');
      std::vector<PathKey> keys = override_keys(text.substr(0, eq == std::string::npos ? 0 : eq), file);
      const bool empty_key =
          std::any_of(keys.begin(), keys.end(), [](const PathKey& k) { return k.name.empty(); });
      if (eq == std::string::npos || empty_key) {
        diags_->add({shown, 0, 0}, "", "expected key.path=value", "for example --set model.n_layers=2");
        continue;
      }
      const SrcPos value_at{file, 0, static_cast<int>(eq) + 2};  // the value's first column
      NodePtr value = parse(text.substr(eq + 1), shown, &value_at);
      if (!value) continue;
      PathError error;
      NodePtr next = set_path(root, keys, value, &error);
      if (!next) {
        diags_->add(error.at.location(), "", error.problem, error.hint);
        continue;
      }
      root = std::move(next);
    }
    return root;
  }

  // The path of an override, "plugins.0.options.max_length", as keys with their columns. A number
  // indexes a list (set_path); `name[3]` is `name.3`. Below an open map (model.weights.inline) the
  // rest of the path is one name, dots and brackets included.
  static std::vector<PathKey> override_keys(const std::string& path,
                                            const std::shared_ptr<const std::string>& file) {
    std::vector<PathKey> parts;
    for (size_t start = 0;;) {
      const size_t dot = path.find('.', start);
      parts.push_back({path.substr(start, dot - start), {file, 0, static_cast<int>(start) + 1}});
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    size_t plain = parts.size();  // parts before this one may hold [N]
    auto below = [&parts](const std::vector<std::string>& open) {
      return parts.size() > open.size() &&
             std::equal(open.begin(), open.end(), parts.begin(),
                        [](const std::string& o, const PathKey& k) { return o == k.name; });
    };
    for (const std::vector<std::string>& open : schema_index().open_maps) {
      if (!below(open)) continue;
      PathKey rest = parts[open.size()];
      for (size_t i = open.size() + 1; i < parts.size(); ++i) rest.name += "." + parts[i].name;
      rest.name_only = true;
      parts.resize(open.size());
      parts.push_back(std::move(rest));
      plain = open.size();
    }
    std::vector<PathKey> keys;
    for (size_t i = 0; i < parts.size(); ++i) {
      const PathKey& p = parts[i];
      // name[3][4]: "name", "3", "4", each at its column; anything else is a name as it is
      std::vector<PathKey> split;
      const size_t open = p.name.find('[');
      bool indices = i < plain && open != std::string::npos && p.name.back() == ']';
      if (indices) {
        if (open > 0) split.push_back({p.name.substr(0, open), p.pos});
        for (size_t at = open; indices && at < p.name.size();) {
          const size_t close = p.name.find(']', at);
          const std::string digits = close == std::string::npos ? "" : p.name.substr(at + 1, close - at - 1);
          indices = p.name[at] == '[' && !digits.empty() &&
                    std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
          if (indices) split.push_back({digits, {file, 0, p.pos.col + static_cast<int>(at) + 1}});
          at = close == std::string::npos ? p.name.size() : close + 1;
        }
      }
      if (indices) {
        keys.insert(keys.end(), split.begin(), split.end());
      } else {
        keys.push_back(p);
      }
    }
    return keys;
  }

  // Replaces model.include by the included model, recursively; `chain` holds the files on the way
  // (absolute, then as shown).
  NodePtr resolve_includes(NodePtr root, std::vector<std::string> chain, std::vector<std::string> shown_chain) {
    const MapEntry* model_entry = root && root->is_map() ? root->find("model") : nullptr;
    if (!model_entry || !model_entry->value->is_map()) return root;
    const Node& model = *model_entry->value;
    const MapEntry* inc = model.find("include");
    if (!inc) return root;
    const std::string key = "model.include";
    c_->exp->locations.emplace(key, inc->key_pos.location());  // the outermost include
    NodePtr rest = without_key(model, "include");
    auto fail = [&](const Location& at, std::string problem, std::string hint = "") {
      c_->error(at, key, std::move(problem), std::move(hint));
      return with_value(*root, "model", rest);
    };
    const Node& v = *inc->value;
    if (!v.is_scalar() || v.text.empty()) return fail(v.pos.location(), "expected a path, found " + describe(v));
    const std::string shown_dir = v.pos.file ? shown_dirs_[*v.pos.file] : std::string();
    const std::string shown = (fs::path(shown_dir) / v.text).lexically_normal().string();
    const fs::path abs = (fs::path(c_->dir_of(v)) / v.text).lexically_normal();
    std::error_code ec;
    const std::string canon = fs::weakly_canonical(abs, ec).string();
    shown_chain.push_back(shown);
    if (std::find(chain.begin(), chain.end(), canon) != chain.end()) {
      return fail(inc->key_pos.location(), "include cycle: " + join(shown_chain, " -> "),
                  "a model file cannot include itself, directly or through others");
    }
    if (static_cast<int>(chain.size()) > kMaxIncludeDepth) {
      return fail(inc->key_pos.location(),
                  "includes nested more than " + std::to_string(kMaxIncludeDepth) + " deep: " + join(shown_chain, " -> "));
    }
    std::string text, why;
    if (!read_file(abs.string(), options_.max_file_bytes, &text, &why)) {
      return fail(inc->key_pos.location(), "cannot read included file " + shown + ": " + why,
                  "a relative path is resolved against the directory of the YAML file that names it");
    }
    add_file(shown, fs::path(shown).parent_path().string(), abs.parent_path());
    NodePtr included = parse(text, shown);
    if (!included) {
      c_->bad.insert(key);
      return with_value(*root, "model", rest);
    }
    chain.push_back(canon);
    included = resolve_includes(included, chain, shown_chain);
    const MapEntry* inc_model = included->is_map() ? included->find("model") : nullptr;
    if (!inc_model || !inc_model->value->is_map()) {
      const Location at = inc_model ? inc_model->value->pos.location() : included->pos.location();
      return fail(at, "the included file has no top-level `model:` mapping",
                  "an included file holds `model:` with the model's keys under it");
    }
    return with_value(*root, "model", merge_nodes(inc_model->value, rest));
  }

  std::optional<Experiment> load(const std::string& text, const std::string& label,
                                 const std::string& shown_dir, const fs::path& abs_dir,
                                 const WorldStep& world) {
    add_file(label, shown_dir, abs_dir);
    c_->root = {label, 1, 1};
    NodePtr root = parse(text, label);
    if (!root) return std::nullopt;
    if (!root->is_map() && !root->is_null()) {
      diags_->add(root->pos.location(), "", "expected a mapping of keys (model:, input:, ...), found " + describe(*root));
      return std::nullopt;
    }
    root = apply_overrides(root);
    std::error_code ec;
    const std::string canon = fs::weakly_canonical(abs_dir / fs::path(label).filename(), ec).string();
    root = resolve_includes(root, {canon}, {label});
    if (root->is_map()) walk_map(*root, "", *c_);
    if (world) world(*c_);  // the resolve layer: plugins, Hugging Face folders
    resolve(*c_);
    if (!diags_->empty()) return std::nullopt;
    return std::move(*c_->exp);
  }

 private:
  const LoadOptions& options_;
  Diagnostics* diags_;
  WalkContext* c_;
  ParseLimits limits_;
  std::map<std::string, std::string> shown_dirs_;  // file as shown -> its directory as shown
};

std::optional<Experiment> load_text(const std::string& text, const std::string& label,
                                    const std::string& shown_dir, const fs::path& abs_dir,
                                    const LoadOptions& options, Diagnostics* diags, const WorldStep& world) {
  Experiment exp;
  exp.file = (abs_dir / fs::path(label).filename()).lexically_normal().string();
  WalkContext c;
  c.exp = &exp;
  c.diags = diags;
  std::string why;
  if (!size_ok(text.size(), options.max_file_bytes, &why)) {
    diags->add({label, 0, 0}, "", why);
    return std::nullopt;
  }
  return Loader(options, diags, &c).load(text, label, shown_dir, abs_dir, world);
}

}  // namespace

std::optional<Experiment> load_file(const std::string& path, const LoadOptions& options, Diagnostics* diags,
                                    const WorldStep& world) {
  std::string text, why;
  if (!config::read_file(path, options.max_file_bytes, &text, &why)) {
    diags->add({path, 0, 0}, "", "cannot read file: " + why);
    return std::nullopt;
  }
  const fs::path shown_dir = fs::path(path).parent_path();
  return load_text(text, path, shown_dir.string(), fs::absolute(shown_dir.empty() ? "." : shown_dir), options,
                   diags, world);
}

std::optional<Experiment> load_string(const std::string& yaml, const std::string& label,
                                      const std::string& base_dir, const LoadOptions& options,
                                      Diagnostics* diags, const WorldStep& world) {
  return load_text(yaml, label, base_dir, fs::absolute(base_dir.empty() ? "." : base_dir), options, diags,
                   world);
}

}  // namespace config

}  // namespace tessera
