// Operations on the loader's YAML tree (node.h): lookup, merge (include, --set), description.
// Nodes are shared and never changed after parsing; these functions build new maps instead.
#include "config/node.h"

namespace tessera::config {
namespace {

void recount(Node& map) {
  map.size = 1;
  for (const MapEntry& e : map.entries) map.size += 1 + e.value->size;
}

NodePtr set_from(const NodePtr& root, const std::vector<std::string>& keys, size_t i,
                 const NodePtr& value, const SrcPos& pos) {
  if (i == keys.size()) return root ? merge_nodes(root, value) : value;
  auto map = std::make_shared<Node>();
  if (root && root->is_map()) {
    *map = *root;
  } else {
    map->kind = Node::Kind::map;
    map->pos = pos;
  }
  bool found = false;
  for (MapEntry& e : map->entries) {
    if (e.key != keys[i]) continue;
    if (i + 1 == keys.size()) e.key_pos = pos;  // the key is now written by the override
    e.value = set_from(e.value, keys, i + 1, value, pos);
    found = true;
    break;
  }
  if (!found) map->entries.push_back({keys[i], pos, set_from(nullptr, keys, i + 1, value, pos)});
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

NodePtr set_path(const NodePtr& root, const std::vector<std::string>& keys, const NodePtr& value,
                 const SrcPos& pos) {
  return set_from(root, keys, 0, value, pos);
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
