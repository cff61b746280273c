// Operations on the loader's YAML tree (node.h): lookup, merge (include, --set), a --set path into
// maps and lists, description.
// Nodes are shared and never changed after parsing; these functions build new maps instead.
#include "config/node.h"

namespace tessera::config {
namespace {

void recount(Node& map) {
  map.size = 1;
  for (const MapEntry& e : map.entries) map.size += 1 + e.value->size;
}

void recount_sequence(Node& seq) {
  seq.size = 1;
  for (const NodePtr& item : seq.items) seq.size += item->size;
}

// A list index as written in a path: decimal digits only (no sign, no spaces).
bool parse_index(const std::string& s, size_t* out) {
  if (s.empty() || s.size() > 18) return false;
  size_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + static_cast<size_t>(ch - '0');
  }
  *out = v;
  return true;
}

NodePtr set_from(const NodePtr& root, const std::vector<PathKey>& keys, size_t i, const NodePtr& value,
                 PathError* error) {
  if (i == keys.size()) return root ? merge_nodes(root, value) : value;
  const PathKey& k = keys[i];
  std::string list;  // the path to here, as written
  for (size_t j = 0; j < i; ++j) list += (j ? "." : "") + keys[j].name;
  size_t index = 0;
  if (i > 0 && !k.name_only && parse_index(k.name, &index) &&
      !(root && (root->is_sequence() || root->is_map()))) {
    // A number where nothing or a scalar is written: there is no list to index.
    *error = {list + (root ? " is not a list" : " is not in the file") + ", so it has no entry " + k.name,
              "set the whole list: --set '" + list + "=[...]'", k.pos};
    return nullptr;
  }
  if (root && root->is_sequence()) {
    const size_t n = root->items.size();
    const std::string entries = list + (n == 0   ? " has no entries"
                                        : n == 1 ? " has 1 entry"
                                                 : " has " + std::to_string(n) + " entries");
    if (!parse_index(k.name, &index)) {
      *error = {list + " is a list: `" + k.name + "` is not an index",
                entries + (n == 0 ? "" : ", 0 to " + std::to_string(n - 1)), k.pos};
      return nullptr;
    }
    if (index >= n) {
      *error = {"index " + k.name + " is out of range", entries, k.pos};
      return nullptr;
    }
    NodePtr item = set_from(root->items[index], keys, i + 1, value, error);
    if (!item) return nullptr;
    auto seq = std::make_shared<Node>(*root);
    seq->items[index] = std::move(item);
    recount_sequence(*seq);
    return seq;
  }
  auto map = std::make_shared<Node>();
  if (root && root->is_map()) {
    *map = *root;
  } else {
    map->kind = Node::Kind::map;
    map->pos = k.pos;
  }
  bool found = false;
  for (MapEntry& e : map->entries) {
    if (e.key != k.name) continue;
    if (i + 1 == keys.size()) e.key_pos = k.pos;  // the key is now written by the override
    NodePtr next = set_from(e.value, keys, i + 1, value, error);
    if (!next) return nullptr;
    e.value = std::move(next);
    found = true;
    break;
  }
  if (!found) {
    NodePtr next = set_from(nullptr, keys, i + 1, value, error);
    if (!next) return nullptr;
    map->entries.push_back({k.name, k.pos, std::move(next)});
  }
  recount(*map);
  return map;
}

}  // namespace

const MapEntry* Node::find(const std::string& key) const {
  for (const MapEntry& e : entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

NodePtr merge_nodes(const NodePtr& base, const NodePtr& overlay) {
  if (!base || !base->is_map() || !overlay->is_map()) return overlay;
  auto merged = std::make_shared<Node>(*base);
  merged->pos = overlay->pos;
  for (const MapEntry& o : overlay->entries) {
    bool found = false;
    for (MapEntry& e : merged->entries) {
      if (e.key != o.key) continue;
      e.key_pos = o.key_pos;
      e.value = merge_nodes(e.value, o.value);
      found = true;
      break;
    }
    if (!found) merged->entries.push_back(o);
  }
  recount(*merged);
  return merged;
}

NodePtr set_path(const NodePtr& root, const std::vector<PathKey>& keys, const NodePtr& value,
                 PathError* error) {
  return set_from(root, keys, 0, value, error);
}

NodePtr without_key(const Node& map, const std::string& key) {
  auto out = std::make_shared<Node>(map);
  std::erase_if(out->entries, [&](const MapEntry& e) { return e.key == key; });
  recount(*out);
  return out;
}

NodePtr with_value(const Node& map, const std::string& key, NodePtr value) {
  auto out = std::make_shared<Node>(map);
  for (MapEntry& e : out->entries) {
    if (e.key == key) e.value = value;
  }
  recount(*out);
  return out;
}

std::string describe(const Node& n) {
  switch (n.kind) {
    case Node::Kind::null: return "null";
    case Node::Kind::sequence: return "a list";
    case Node::Kind::map: return "a mapping";
    case Node::Kind::scalar: break;
  }
  constexpr size_t kShown = 40;
  std::string text = n.text.size() > kShown ? n.text.substr(0, kShown) + "..." : n.text;
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && !n.plain) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return n.plain ? out : "\"" + out + "\"";
}

}  // namespace tessera::config
