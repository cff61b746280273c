// YAML text -> the loader's tree (node.h). The only file in Tessera that includes yaml-cpp.
// It listens to yaml-cpp's parse events instead of building YAML::Node, so that it controls what
// yaml-cpp's own tree does not: duplicate keys, alias expansion (billion laughs), depth, cycles.
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "config/node.h"

namespace tessera::config {
namespace {

// Thrown by the event handler to stop yaml-cpp once a problem makes the rest meaningless; the
// diagnostic is already recorded.
struct StopParse {};

// yaml-cpp's tag for an untagged plain node, an untagged quoted or block scalar, and !!str.
constexpr const char* kPlainTag = "?";
constexpr const char* kNonPlainTag = "!";
constexpr const char* kYamlTagPrefix = "tag:yaml.org,2002:";

void report_too_deep(Diagnostics* diags, const SrcPos& at, int max_depth) {
  diags->add(at.location(), "", "nesting deeper than max_depth (" + std::to_string(max_depth) + ")",
             "LoadOptions::max_depth sets the limit");
}

// The offset of the first byte of `s` that does not belong to a well-formed UTF-8 sequence
// (Unicode 15, table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF), or npos.
size_t invalid_utf8_at(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF)
      len = 2;
    else if (b == 0xE0)
      len = 3, lo = 0xA0;
    else if (b == 0xED)
      len = 3, hi = 0x9F;
    else if (b >= 0xE1 && b <= 0xEF)
      len = 3;
    else if (b == 0xF0)
      len = 4, lo = 0x90;
    else if (b == 0xF4)
      len = 4, hi = 0x8F;
    else if (b >= 0xF1 && b <= 0xF3)
      len = 4;
    else
      return i;
    if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (i + k >= n || (p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(const std::string& file, const ParseLimits& limits, Diagnostics* diags, const SrcPos* inline_at)
      : file_(std::make_shared<const std::string>(file)), limits_(limits), diags_(diags) {
    if (inline_at) {
      inline_ = true;
      inline_at_ = *inline_at;
    }
  }

  NodePtr root() const { return root_; }
  SrcPos pos(const YAML::Mark& m) const {
    // Text of one argument: its offset in the text, from the value's column in the argument.
    if (inline_) return {file_, inline_at_.line, inline_at_.col + std::max(m.pos, 0)};
    if (m.line < 0) return {file_, 0, 0};
    return {file_, m.line + 1, m.column + 1};
  }

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}

  void OnAnchor(const YAML::Mark&, const std::string& name) override { next_anchor_name_ = name; }

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto n = std::make_shared<Node>();
    n->pos = pos(mark);
    // An empty value (`d_model:` and nothing) is marked at the next token, often on a later line;
    // its key's place says better where it is.
    if (!stack_.empty() && stack_.back().node->is_map() && stack_.back().have_key &&
        n->pos.line != stack_.back().key_pos.line) {
      n->pos = stack_.back().key_pos;
    }
    complete(std::move(n), anchor);
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::scalar;
    n->pos = pos(mark);
    n->text = value;
    n->plain = tag == kPlainTag;
    if (tag != kPlainTag && tag != kNonPlainTag && tag != std::string(kYamlTagPrefix) + "str") {
      add(n->pos, "", "YAML tag " + tag + " is not supported", "remove the tag");
    }
    complete(std::move(n), anchor);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    SrcPos at = pos(mark);
    if (open_anchors_.count(anchor)) {
      add(at, "", "alias *" + anchor_names_[anchor] + " refers to a node that contains it",
          "an anchor cannot be used inside its own value");
      throw StopParse{};
    }
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) {
      add(at, "", "alias to an unknown anchor");
      throw StopParse{};
    }
    NodePtr target = it->second;
    count(at, target->size);
    if (target->is_scalar() || target->is_null()) {
      // A copy, so that a wrong value is reported where the alias uses it.
      auto copy = std::make_shared<Node>(*target);
      copy->pos = at;
      target = std::move(copy);
    }
    attach(std::move(target), at);
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, tag, anchor, Node::Kind::sequence);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, tag, anchor, Node::Kind::map);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    std::shared_ptr<Node> node;
    YAML::anchor_t anchor = YAML::NullAnchor;
    bool have_key = false;    // map: the next node is the value of `key`
    bool skip_value = false;  // map: the next node belongs to a rejected key
    std::string key;
    SrcPos key_pos;
    std::unordered_map<std::string, SrcPos> seen;  // map: keys so far
  };

  void add(const SrcPos& at, std::string key, std::string problem, std::string hint = "") {
    diags_->add(at.location(), std::move(key), std::move(problem), std::move(hint));
  }

  // Every node, and every node an alias stands for, counts against max_nodes.
  void count(const SrcPos& at, size_t n) {
    total_ += n;
    if (total_ > limits_.max_nodes) {
      add(at, "",
          "the document expands to more than " + std::to_string(limits_.max_nodes) +
              " nodes (aliases counted each time they are used)",
          "is this a YAML bomb? LoadOptions::max_nodes sets the limit");
      throw StopParse{};
    }
  }

  void name_anchor(YAML::anchor_t anchor) {
    if (anchor == YAML::NullAnchor) return;
    anchor_names_[anchor] = next_anchor_name_;
  }

  void open(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
            Node::Kind kind) {
    SrcPos at = pos(mark);
    if (static_cast<int>(stack_.size()) >= limits_.max_depth) {
      report_too_deep(diags_, at, limits_.max_depth);
      throw StopParse{};
    }
    const std::string std_tag =
        std::string(kYamlTagPrefix) + (kind == Node::Kind::map ? "map" : "seq");
    if (tag != kPlainTag && tag != kNonPlainTag && tag != std_tag) {
      add(at, "", "YAML tag " + tag + " is not supported", "remove the tag");
    }
    count(at, 1);
    name_anchor(anchor);
    if (anchor != YAML::NullAnchor) open_anchors_.insert(anchor);
    Frame f;
    f.node = std::make_shared<Node>();
    f.node->kind = kind;
    f.node->pos = at;
    f.anchor = anchor;
    stack_.push_back(std::move(f));
  }

  void close() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    if (f.anchor != YAML::NullAnchor) {
      open_anchors_.erase(f.anchor);
      anchors_[f.anchor] = f.node;
    }
    SrcPos at = f.node->pos;
    attach(std::move(f.node), at);
  }

  // A scalar or null, finished as soon as it starts.
  void complete(std::shared_ptr<Node> n, YAML::anchor_t anchor) {
    count(n->pos, 1);
    name_anchor(anchor);
    if (anchor != YAML::NullAnchor) anchors_[anchor] = n;
    SrcPos at = n->pos;
    attach(std::move(n), at);
  }

  std::string path_here() const {
    std::string path;
    for (const Frame& f : stack_) {
      if (f.node->is_map() && f.have_key) {
        path += (path.empty() ? "" : ".") + f.key;
      } else if (f.node->is_sequence()) {
        path += '[';
        path += std::to_string(f.node->items.size());
        path += ']';
      }
    }
    return path;
  }

  void attach(NodePtr child, const SrcPos& at) {
    if (stack_.empty()) {
      root_ = std::move(child);
      return;
    }
    Frame& top = stack_.back();
    Node& parent = *top.node;
    if (parent.is_sequence()) {
      parent.size += child->size;
      parent.items.push_back(std::move(child));
      return;
    }
    if (!top.have_key) {  // a key
      const std::string map_path = path_here();
      top.have_key = true;
      top.skip_value = false;
      top.key_pos = at;
      if (!child->is_scalar()) {
        add(at, map_path, child->is_null() ? "empty mapping key" : "mapping keys must be scalars",
            "write `name: value`");
        top.skip_value = true;
        return;
      }
      top.key = child->text;
      auto [it, fresh] = top.seen.emplace(top.key, at);
      if (!fresh) {
        add(at, map_path.empty() ? top.key : map_path + "." + top.key,
            "duplicate key (first written at " + std::to_string(it->second.line) + ":" +
                std::to_string(it->second.col) + ")",
            "remove one of them");
        top.skip_value = true;
      }
      return;
    }
    top.have_key = false;
    if (top.skip_value) return;
    parent.size += 1 + child->size;  // the key and its value
    parent.entries.push_back({std::move(top.key), top.key_pos, std::move(child)});
  }

  std::shared_ptr<const std::string> file_;
  ParseLimits limits_;
  Diagnostics* diags_;
  bool inline_ = false;
  SrcPos inline_at_;
  NodePtr root_;
  std::vector<Frame> stack_;
  std::unordered_map<YAML::anchor_t, NodePtr> anchors_;
  std::unordered_map<YAML::anchor_t, std::string> anchor_names_;
  std::unordered_set<YAML::anchor_t> open_anchors_;
  std::string next_anchor_name_;
  size_t total_ = 0;
};

// yaml-cpp ignores the document-end events; this one only notices that a second document exists.
class DocumentProbe : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { seen(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { seen(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    seen(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    seen(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    seen(m);
  }
  void OnMapEnd() override {}

  bool found = false;
  YAML::Mark mark;

 private:
  void seen(const YAML::Mark& m) {
    if (!found) mark = m;
    found = true;
    throw StopParse{};  // the first node is enough
  }
};

// yaml-cpp's scanner reads a whole flow collection ahead before it reports the first node of it,
// and for deeply nested ones it holds per-level state: 16 MB of `[` costs it ~16 s and 2 GB before
// the event handler can refuse the depth. This pass finds the first `[` or `{` that would open a
// flow collection deeper than max_depth, in one cheap sweep. It skips what YAML does not nest
// (quoted scalars, comments, block scalars, brackets inside plain scalars); in odd corners (a plain
// scalar such as `a:[`) it may count a bracket YAML does not, and what it misses the event handler
// still refuses at max_depth, only more slowly.
size_t find_deep_flow(const std::string& s, int max_depth) {
  int depth = 0;
  char last = 0;           // last significant character on this line; 0 at the line's start
  char token_first = 0;    // first character of the current or last token on this line
  size_t line_indent = 0;  // spaces before the first character of this line
  bool at_line_start = true;
  size_t block_parent = std::string::npos;  // in a block scalar: lines indented more than this
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (at_line_start) {
      size_t j = i;
      while (j < s.size() && s[j] == ' ') ++j;
      const bool blank = j == s.size() || s[j] == '\n' || s[j] == '\r';
      if (block_parent != std::string::npos) {
        if (blank || j - i > block_parent) {  // a line of the block scalar: skip it
          while (i < s.size() && s[i] != '\n') ++i;
          continue;
        }
        block_parent = std::string::npos;
      }
      line_indent = j - i;
      at_line_start = false;
      last = 0;
      token_first = 0;
      i = j;
      if (i == s.size()) break;
      c = s[i];
    }
    const char prev = i > 0 ? s[i - 1] : '\n';
    const bool after_space = prev == ' ' || prev == '\t' || prev == '\n' || prev == '\r';
    if (c == '\n') {
      at_line_start = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    if (after_space) token_first = c;
    if (c == '#' && after_space) {  // a comment, to the end of the line
      while (i + 1 < s.size() && s[i + 1] != '\n') ++i;
      continue;
    }
    const bool starts_node = last == 0 || last == ':' || last == '-' || last == '?' ||
                             (after_space && (token_first == '&' || token_first == '!'));
    if ((c == '"' || c == '\'') &&
        (after_space || (depth > 0 && (prev == '[' || prev == '{' || prev == ',' || prev == ':')))) {
      for (++i; i < s.size(); ++i) {  // to the closing quote, across lines
        if (c == '"' && s[i] == '\\') {
          ++i;
        } else if (s[i] == c) {
          if (c == '\'' && i + 1 < s.size() && s[i + 1] == '\'') {
            ++i;
          } else {
            break;
          }
        }
      }
      last = c;
      continue;
    }
    if (c == '[' || c == '{') {
      if (depth > 0 || starts_node) {
        if (++depth > max_depth) return i;
        last = c;
        continue;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if ((c == '|' || c == '>') && depth == 0 && starts_node) {
      block_parent = line_indent;
      while (i + 1 < s.size() && s[i + 1] != '\n') ++i;  // the header: indicators, a comment
    }
    last = c;
  }
  return std::string::npos;
}

}  // namespace

NodePtr parse_yaml(const std::string& text, const std::string& file, const ParseLimits& limits,
                   Diagnostics* diags, const SrcPos* inline_at) {
  TreeBuilder builder(file, limits, diags, inline_at);
  // yaml-cpp would pass invalid bytes through into names, paths and strings; a config is UTF-8.
  if (const size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
    YAML::Mark mark;
    mark.pos = static_cast<int>(bad);
    for (size_t i = 0; i < bad; ++i) {
      if (text[i] == '\n') {
        ++mark.line;
        mark.column = 0;
      } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
        ++mark.column;  // characters, not bytes: the text before `bad` is valid UTF-8
      }
    }
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[bad]));
    diags->add(builder.pos(mark).location(), "",
               "not UTF-8: the byte " + std::string(byte) + " at byte offset " + std::to_string(bad) +
                   " is not part of a valid UTF-8 character",
               "a config file must be UTF-8; convert it, e.g. with `iconv -f latin1 -t utf-8`");
    return nullptr;
  }
  const size_t deep = find_deep_flow(text, limits.max_depth);
  if (deep != std::string::npos) {
    YAML::Mark mark;
    mark.pos = static_cast<int>(deep);
    for (size_t i = 0; i < deep; ++i) {
      if (text[i] == '\n') {
        ++mark.line;
        mark.column = 0;
      } else {
        ++mark.column;
      }
    }
    report_too_deep(diags, builder.pos(mark), limits.max_depth);
    return nullptr;
  }
  std::istringstream in(text);
  try {
    YAML::Parser parser(in);
    if (!parser.HandleNextDocument(builder)) {  // nothing but comments and blank lines
      auto empty = std::make_shared<Node>();
      empty->pos = builder.pos(YAML::Mark());  // line 1, col 1
      return empty;
    }
    DocumentProbe probe;
    try {
      parser.HandleNextDocument(probe);
    } catch (const StopParse&) {
    }
    if (probe.found) {
      diags->add(builder.pos(probe.mark).location(), "",
                 "a second YAML document (after ---); a config file holds one",
                 "remove the `---` line and what follows, or split the file");
    }
  } catch (const StopParse&) {
    return nullptr;
  } catch (const YAML::DeepRecursion& e) {
    diags->add(builder.pos(e.mark).location(), "", "nesting deeper than the YAML parser allows",
               "LoadOptions::max_depth should stay below yaml-cpp's own limit");
    return nullptr;
  } catch (const YAML::Exception& e) {
    diags->add(builder.pos(e.mark).location(), "", "YAML syntax error: " + e.msg);
    return nullptr;
  } catch (const std::exception& e) {
    diags->add(builder.pos(YAML::Mark::null_mark()).location(), "",
               std::string("the YAML parser failed: ") + e.what());
    return nullptr;
  }
  // Duplicate keys and unsupported tags are reported but do not stop the load: the tree (first
  // value of a duplicated key) is still validated, so that every problem is reported at once.
  return builder.root();
}

}  // namespace tessera::config
