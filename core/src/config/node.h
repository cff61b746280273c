// The config loader's own YAML tree: null / scalar / sequence / map nodes, each with file, line and
// col; map keys keep their written order and their own location. Only yaml_parse.cpp knows
// yaml-cpp; include, --set, validation and resolution all work on this tree. Not a general YAML DOM.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tessera/config.h"

namespace tessera::config {

// Where a node was written. The file name is shared by every node of one file.
struct SrcPos {
  std::shared_ptr<const std::string> file;
  int line = 0;  // 1-based
  int col = 0;   // 1-based
  Location location() const { return {file ? *file : std::string(), line, col}; }
};

struct Node;
// Nodes are immutable once built and shared: an alias to a collection points to the anchored node,
// and merging or overriding copies only the maps on the path it changes.
using NodePtr = std::shared_ptr<const Node>;

struct MapEntry {
  std::string key;
  SrcPos key_pos;
  NodePtr value;
};

struct Node {
  enum class Kind { null, scalar, sequence, map };
  Kind kind = Kind::null;
  bool plain = true;  // scalar written without quotes or block style: `5` is a number, `"5"` text
  std::string text;   // scalar
  std::vector<NodePtr> items;     // sequence
  std::vector<MapEntry> entries;  // map, in written order, keys unique
  SrcPos pos;
  size_t size = 1;  // nodes in this subtree with aliases expanded (what a walk of it visits)

  bool is_null() const { return kind == Kind::null; }
  bool is_scalar() const { return kind == Kind::scalar; }
  bool is_sequence() const { return kind == Kind::sequence; }
  bool is_map() const { return kind == Kind::map; }
  const MapEntry* find(const std::string& key) const;  // map entry or nullptr
};

// What the parser refuses (LoadOptions carries the user's values).
struct ParseLimits {
  int max_depth = 64;
  size_t max_nodes = 1'000'000;
};

// Parses one YAML document. `file` names it in locations and diagnostics. When `inline_at` is
// given (the value of a --set argument), the text is one line of a command: every node is placed
// at line inline_at->line and at column inline_at->col plus its offset in `text`. Problems go to
// diags; returns nullptr when the text cannot be turned into a tree (syntax, bombs, cycles) and
// the tree otherwise (a duplicated key keeps its first value). An empty document gives a null node.
NodePtr parse_yaml(const std::string& text, const std::string& file, const ParseLimits& limits,
                   Diagnostics* diags, const SrcPos* inline_at = nullptr);

// `overlay` written over `base`: maps merge key by key (recursively, base's order first, new keys
// after); anything else replaces. Used by model.include and by --set.
NodePtr merge_nodes(const NodePtr& base, const NodePtr& overlay);

// One step of a --set path, and where it is written in the argument.
struct PathKey {
  std::string name;
  SrcPos pos;
  bool name_only = false;  // a map key even when it is a number (a name below an open map)
};

// Why set_path could not follow a path: the problem, a hint, and the key it is about.
struct PathError {
  std::string problem, hint;
  SrcPos at;
};

// `root` with the value at `keys` merged with `value` as merge_nodes does. Where the node on the
// way is a sequence, the key is the 0-based index of one of its items, which must exist: that item
// alone is replaced (or merged into); otherwise the key names a map entry, created as needed, and
// a non-map on the way is replaced by a map. Returns nullptr with *error filled in when a key
// cannot index a sequence (not a number, or out of range), and for a number where no list is
// (nothing written there, or a scalar).
NodePtr set_path(const NodePtr& root, const std::vector<PathKey>& keys, const NodePtr& value,
                 PathError* error);

// A map without `key`, and a map with the value of its existing `key` replaced.
NodePtr without_key(const Node& map, const std::string& key);
NodePtr with_value(const Node& map, const std::string& key, NodePtr value);

// How a value is named in "expected X, found Y": the scalar as written (quoted if it was), or
// "a list", "a mapping", "null".
std::string describe(const Node& n);

}  // namespace tessera::config
