// The config schema: every key with its type, default and meaning (KeySpec), how its value is read
// and checked, how it is printed, and the defaults and consistency rules that involve several keys.
// The walk over the YAML tree and the file handling live in loader.cpp.
#include "config/schema.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "config/expr.h"
#include "tessera/model.h"
#include "tessera/plugins.h"
#include "tessera/random.h"

namespace tessera {
namespace config {
namespace {

template <class E>
using Names = std::vector<std::pair<const char*, E>>;

const Names<Arch> kArchNames = {{"encoder", Arch::encoder}, {"decoder", Arch::decoder}};
const Names<Activation> kActivationNames = {
    {"relu", Activation::relu}, {"gelu", Activation::gelu_erf}, {"gelu_tanh", Activation::gelu_tanh}};
const Names<NormPlacement> kNormNames = {
    {"post", NormPlacement::post}, {"pre", NormPlacement::pre}, {"none", NormPlacement::none}};
const Names<DType> kDTypeNames = {{"f32", DType::f32}, {"bf16", DType::bf16}};
const Names<PositionKind> kPositionNames = {{"none", PositionKind::none},
                                            {"sinusoidal", PositionKind::sinusoidal},
                                            {"learned", PositionKind::learned},
                                            {"relative", PositionKind::relative},
                                            {"rotary", PositionKind::rotary}};
const Names<RotaryStyle> kRotaryNames = {{"half", RotaryStyle::half},
                                         {"interleaved", RotaryStyle::interleaved}};
const Names<StemKind> kStemNames = {{"tokens", StemKind::tokens},
                                    {"features", StemKind::features},
                                    {"identity", StemKind::identity},
                                    {"mixed", StemKind::mixed}};
const Names<EmbedScale> kEmbedScaleNames = {{"none", EmbedScale::none},
                                            {"sqrt_d_model", EmbedScale::sqrt_d_model}};
const Names<HeadKind> kHeadNames = {{"none", HeadKind::none},
                                    {"pool", HeadKind::pool},
                                    {"classifier", HeadKind::classifier},
                                    {"lm", HeadKind::lm}};
const Names<Objective> kObjectiveNames = {
    {"auto", Objective::auto_detect}, {"classify", Objective::classify}, {"lm", Objective::lm}, {"mlm", Objective::mlm}};
const Names<OptimizerKind> kOptimizerNames = {{"adamw", OptimizerKind::adamw}, {"sgd", OptimizerKind::sgd}};
const Names<ScheduleKind> kScheduleNames = {
    {"cosine", ScheduleKind::cosine}, {"linear", ScheduleKind::linear}, {"constant", ScheduleKind::constant}};
const Names<TrainMetric> kMetricNames = {
    {"auto", TrainMetric::auto_detect}, {"loss", TrainMetric::loss}, {"accuracy", TrainMetric::accuracy},
    {"macro_f1", TrainMetric::macro_f1}, {"task_mean", TrainMetric::task_mean}};
const Names<Baseline> kBaselineNames = {{"none", Baseline::none},
                                        {"unigram", Baseline::unigram},
                                        {"bigram", Baseline::bigram},
                                        {"proximity", Baseline::proximity}};
const Names<DataFormat> kDataFormatNames = {
    {"auto", DataFormat::auto_detect}, {"dir", DataFormat::dir},
    {"glob", DataFormat::glob},        {"manifest", DataFormat::manifest},
    {"fasta", DataFormat::fasta},      {"lines", DataFormat::lines},
    {"idx", DataFormat::idx}};
const Names<TaskKind> kTaskNames = {{"embed", TaskKind::embed},
                                    {"hidden", TaskKind::hidden},
                                    {"classify", TaskKind::classify},
                                    {"score", TaskKind::score},
                                    {"generate", TaskKind::generate}};
const Names<PoolKind> kPoolNames = {
    {"cls", PoolKind::cls}, {"mean", PoolKind::mean}, {"last", PoolKind::last}, {"cls_dist", PoolKind::cls_dist},
    {"max", PoolKind::max}};
const Names<ModelSource> kSourceNames = {{"tessera", ModelSource::tessera}, {"hf", ModelSource::hf}};
// Names from random.h, so that the config and the initialiser cannot disagree.
const Names<InitScheme> kInitNames = [] {
  Names<InitScheme> n;
  for (InitScheme s : {InitScheme::glorot_normal, InitScheme::glorot_uniform, InitScheme::he_normal,
                       InitScheme::normal, InitScheme::zeros})
    n.emplace_back(init_scheme_name(s), s);
  return n;
}();

template <class E>
const char* name_of(const Names<E>& names, E value) {
  for (const auto& [name, v] : names) {
    if (v == value) return name;
  }
  return "?";
}

template <class E>
std::string join_names(const Names<E>& names, const char* sep) {
  std::string out;
  for (const auto& [name, v] : names) out += (out.empty() ? "" : sep) + std::string(name);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Scalars.

bool is_int_text(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

// YAML 1.2 core-schema floats: 1, 1.5, .5, 1e-5, -2.5E+3, .inf, -.inf, .nan.
bool parse_float_text(const std::string& s, double* out) {
  std::string body = s;
  double sign = 1.0;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    if (body[0] == '-') sign = -1.0;
    body.erase(0, 1);
  }
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    *out = sign * std::numeric_limits<double>::infinity();
    return true;
  }
  if (body == ".nan" || body == ".NaN" || body == ".NAN") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (body.empty() || !(std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.')) return false;
  for (char c : body) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' ||
          c == '-')) {
      return false;
    }
  }
  double v = 0.0;
  auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), v);
  if (end != body.data() + body.size() || ec == std::errc::invalid_argument) return false;
  *out = sign * (ec == std::errc::result_out_of_range ? std::numeric_limits<double>::infinity() : v);
  return true;
}

std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

// The shortest text that reads back (as a double rounded to f32, as the loader reads it) to `v`.
std::string format_f32(float v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  double back = 0.0;
  std::from_chars(s.data(), s.data() + s.size(), back);
  return static_cast<float>(back) == v ? s : format_double(v);
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          static const char* hex = "0123456789abcdef";
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// A map key as YAML: plain when it reads back as the same text, quoted otherwise.
std::string key_text(const std::string& s) {
  bool plain = !s.empty() && (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_');
  for (char c : s) {
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-');
  }
  if (s == "null" || s == "Null" || s == "NULL") plain = false;
  return plain ? s : quote(s);
}

struct IntBound {
  int64_t min;
  const char* text;  // "> 0", ">= 1", ">= 0"
  int64_t max = std::numeric_limits<int64_t>::max();
  const char* why = nullptr;  // why max is the limit (tessera/config.h, limits), for the hint
  // As the schema's type column writes it: "int > 0, at most 65536".
  std::string type() const {
    std::string t = std::string("int ") + text;
    if (max != std::numeric_limits<int64_t>::max()) t += ", at most " + std::to_string(max);
    return t;
  }
};
constexpr IntBound kPositive{1, "> 0"};
constexpr IntBound kAtLeastOne{1, ">= 1"};
constexpr IntBound kNonNegative{0, ">= 0"};

// The limits of sizes (tessera/config.h), each with its reason. Every one keeps the products the
// runtime forms from it inside 64 bits; the machine's memory is the memory plan's business.
constexpr const char* kWhyWidth = "over 5 times the widest published model (GPT-3: 12288)";
constexpr const char* kWhyHidden = "over 14 times the widest published feed-forward layer (PaLM: 73728)";
constexpr const char* kWhyLayers = "over 30 times the deepest published transformer";
constexpr const char* kWhyHeads = "far more heads than any published model (at most 128)";
constexpr const char* kWhyVocab =
    "token ids are 32-bit, and 2^24 is 64 times the largest published vocabulary";
constexpr const char* kWhySequence =
    "2^20 rows; one such sequence's attention scores are already 4 TiB per head";
constexpr const char* kWhyTable = "a table of embeddings far larger than any model's";
constexpr const char* kWhyThreads =
    "more threads than any machine has cores; the OpenMP runtime crashes when it cannot start them";
constexpr const char* kWhyBatch = "2^16 sequences per batch";
constexpr const char* kWhyCount = "far more than any run needs";
IntBound upto(IntBound b, int64_t max, const char* why) {
  b.max = max;
  b.why = why;
  return b;
}
const IntBound kWidthBound = upto(kPositive, limits::kWidth, kWhyWidth);
const IntBound kHeadsBound = upto(kAtLeastOne, limits::kHeads, kWhyHeads);
const IntBound kVocabBound = upto(kPositive, limits::kVocab, kWhyVocab);
const IntBound kSequenceBound = upto(kAtLeastOne, limits::kSequence, kWhySequence);
const IntBound kBatchBound = upto(kAtLeastOne, limits::kBatch, kWhyBatch);
const IntBound kThreadsBound = upto(kNonNegative, limits::kThreads, kWhyThreads);
const IntBound kStepsBound = upto(kNonNegative, limits::kSteps, kWhyCount);
const IntBound kItemBound = upto(kNonNegative, int64_t{1} << 50, "a pebibyte: beyond any machine's memory or disk");

// "4611686018427387904 is more than the limit 1048576" (and why, as the hint).
void over_limit(const Node& n, const std::string& key, WalkContext& c, const IntBound& b,
                const std::string& what) {
  c.error(n, key, what + n.text + " is more than the limit " + std::to_string(b.max),
          b.why ? std::string(b.why) : std::string());
}

// `what` prefixes the problem ("entry 3: ") when the value is one entry of a list.
bool read_int(const Node& n, const std::string& key, WalkContext& c, const IntBound& b, int64_t* out,
              const std::string& what = "") {
  if (!n.is_scalar() || !n.plain || !is_int_text(n.text)) {
    c.error(n, key, what + "expected int, found " + describe(n));
    return false;
  }
  const char* first = n.text.data() + (n.text[0] == '+' ? 1 : 0);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(first, n.text.data() + n.text.size(), v);
  if (ec == std::errc::result_out_of_range || v > b.max) {
    if (n.text[0] == '-') {
      c.error(n, key, what + "must be " + b.text + ", found " + n.text);
    } else {
      over_limit(n, key, c, b, what);
    }
    return false;
  }
  if (v < b.min) {
    c.error(n, key, what + "must be " + b.text + ", found " + n.text);
    return false;
  }
  *out = v;
  return true;
}

// `type` names what was expected when the value is no number at all.
bool read_positive_float(const Node& n, const std::string& key, WalkContext& c, double* out,
                         const std::string& type = "float") {
  double v = 0.0;
  if (!n.is_scalar() || !n.plain || !parse_float_text(n.text, &v)) {
    c.error(n, key, "expected " + type + ", found " + describe(n));
    return false;
  }
  if (!std::isfinite(v)) {
    c.error(n, key, "must be a finite number, found " + n.text);
    return false;
  }
  if (!(v > 0.0)) {
    c.error(n, key, "must be > 0, found " + n.text);
    return false;
  }
  *out = v;
  return true;
}

bool read_bool(const Node& n, const std::string& key, WalkContext& c, bool* out) {
  if (n.is_scalar() && n.plain) {
    const std::string& t = n.text;
    if (t == "true" || t == "True" || t == "TRUE") {
      *out = true;
      return true;
    }
    if (t == "false" || t == "False" || t == "FALSE") {
      *out = false;
      return true;
    }
  }
  c.error(n, key, "expected bool (true or false), found " + describe(n));
  return false;
}

bool read_string(const Node& n, const std::string& key, WalkContext& c, std::string* out,
                 const std::string& what = "") {
  if (!n.is_scalar()) {
    c.error(n, key, what + "expected string, found " + describe(n));
    return false;
  }
  *out = n.text;
  return true;
}

template <class E>
bool read_enum(const Node& n, const std::string& key, WalkContext& c, const Names<E>& names, E* out) {
  if (n.is_scalar()) {
    for (const auto& [name, v] : names) {
      if (n.text == name) {
        *out = v;
        return true;
      }
    }
  }
  std::string hint;
  if (n.is_scalar()) {
    std::vector<std::string> candidates;
    for (const auto& [name, v] : names) candidates.emplace_back(name);
    std::string near = nearest(n.text, candidates);
    if (!near.empty()) hint = "did you mean `" + near + "`?";
  }
  c.error(n, key, "expected one of " + join_names(names, ", ") + ", found " + describe(n), hint);
  return false;
}

// One number of a matrix or vector: a YAML number or a string holding an expression (expr.h).
bool read_number(const Node& n, const std::string& key, WalkContext& c, const std::string& entry,
                 float* out) {
  if (!n.is_scalar()) {
    c.error(n, key, entry + ": expected a number, found " + describe(n));
    return false;
  }
  ExprResult r = evaluate_expression(n.text);
  double v = r.value;
  if (r.ok && std::fabs(v) > std::numeric_limits<float>::max()) {
    r.ok = false;
    r.error = "the value is outside the f32 range";
    r.error_offset = 0;
  }
  if (!r.ok) {
    Location at = n.pos.location();
    if (at.col > 0) at.col += static_cast<int>(r.error_offset) + (n.plain ? 0 : 1);
    constexpr size_t kShown = 40;
    const std::string text = n.text.size() > kShown ? n.text.substr(0, kShown) + "..." : n.text;
    c.error(at, key, entry + ": bad expression \"" + text + "\": " + r.error);
    return false;
  }
  *out = static_cast<float>(v);
  return true;
}

// A matrix (a list of rows of numbers), or with `allow_vector` also a vector (a list of numbers).
bool read_tensor(const Node& n, const std::string& key, WalkContext& c, bool allow_vector,
                 Tensor* out) {
  const std::string expected = allow_vector ? "a matrix or a vector (a list of rows, or of numbers)"
                                            : "a matrix (a list of rows of numbers)";
  if (!n.is_sequence() || n.items.empty()) {
    c.error(n, key, "expected " + expected + ", found " + (n.is_sequence() ? "an empty list" : describe(n)));
    return false;
  }
  bool ok = true;
  std::vector<float> values;
  if (!n.items[0]->is_sequence()) {
    if (!allow_vector) {
      c.error(*n.items[0], key, "row 0: expected a list of numbers, found " + describe(*n.items[0]));
      return false;
    }
    values.resize(n.items.size());
    for (size_t i = 0; i < n.items.size(); ++i) {
      ok = read_number(*n.items[i], key, c, "entry [" + std::to_string(i) + "]", &values[i]) && ok;
    }
    if (ok) *out = Tensor::from_vector({static_cast<int64_t>(values.size())}, values);
    return ok;
  }
  const size_t cols = n.items[0]->items.size();
  for (size_t i = 0; i < n.items.size(); ++i) {
    const Node& row = *n.items[i];
    const std::string name = "row " + std::to_string(i);
    if (!row.is_sequence()) {
      c.error(row, key, name + ": expected a list of numbers, found " + describe(row),
              "a matrix is a list of rows, every row a list of numbers");
      ok = false;
      continue;
    }
    if (row.items.empty()) {
      c.error(row, key, name + " is empty");
      ok = false;
      continue;
    }
    if (row.items.size() != cols) {
      c.error(row, key,
              name + " has " + std::to_string(row.items.size()) + " values, but row 0 has " +
                  std::to_string(cols),
              "every row of a matrix must have the same length");
      ok = false;
      continue;
    }
    for (size_t j = 0; j < cols; ++j) {
      float v = 0.0f;
      ok = read_number(*row.items[j], key, c, "entry [" + std::to_string(i) + "][" + std::to_string(j) + "]", &v) && ok;
      values.push_back(v);
    }
  }
  if (ok) {
    *out = Tensor::from_vector({static_cast<int64_t>(n.items.size()), static_cast<int64_t>(cols)}, values);
  }
  return ok;
}

std::string print_tensor(const Tensor& t) {
  auto row_text = [](const float* p, int64_t n) {
    std::string s = "[";
    for (int64_t j = 0; j < n; ++j) s += (j ? ", " : "") + format_f32(p[j]);
    return s + "]";
  };
  std::vector<float> v = t.to_vector();
  if (t.rank() == 1) return row_text(v.data(), t.dim(0));
  std::string out;
  for (int64_t i = 0; i < t.dim(0); ++i) out += "\n- " + row_text(v.data() + i * t.dim(1), t.dim(1));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Rules. FIELD(model.d_model) is an accessor that works on a const and a mutable Experiment.

#define FIELD(member) [](auto& e) -> auto& { return e.member; }

template <class Get>
KeyRule int_key(std::string path, IntBound b, std::string def, std::string meaning, Get get,
                bool nullable = false) {
  KeyRule r;
  r.spec = {std::move(path), b.type(), std::move(def), std::move(meaning)};
  r.nullable = nullable;
  r.read = [get, b](const Node& n, const std::string& key, WalkContext& c) {
    int64_t v = 0;
    if (!read_int(n, key, c, b, &v)) return false;
    get(*c.exp) = static_cast<std::remove_reference_t<decltype(get(*c.exp))>>(v);
    return true;
  };
  r.print = [get, nullable](const Experiment& e) {
    auto v = get(e);
    return nullable && v == 0 ? std::string("null") : std::to_string(v);
  };
  return r;
}

template <class Get>
KeyRule float_key(std::string path, std::string def, std::string meaning, Get get) {
  KeyRule r;
  r.spec = {std::move(path), "float > 0", std::move(def), std::move(meaning)};
  r.read = [get](const Node& n, const std::string& key, WalkContext& c) {
    return read_positive_float(n, key, c, &get(*c.exp));
  };
  r.print = [get](const Experiment& e) { return format_double(get(e)); };
  return r;
}

// A float in a range of its own: `range` is how the type and the problem name it ("in (0, 1]"),
// `inside` decides a finite value.
template <class Get>
KeyRule float_range_key(std::string path, std::string range, bool (*inside)(double), std::string def,
                        std::string meaning, Get get) {
  KeyRule r;
  r.spec = {std::move(path), "float " + range, std::move(def), std::move(meaning)};
  r.read = [get, range, inside](const Node& n, const std::string& key, WalkContext& c) {
    double v = 0.0;
    if (!n.is_scalar() || !n.plain || !parse_float_text(n.text, &v)) {
      c.error(n, key, "expected float, found " + describe(n));
      return false;
    }
    if (!std::isfinite(v)) {
      c.error(n, key, "must be a finite number, found " + n.text);
      return false;
    }
    if (!inside(v)) {
      c.error(n, key, "must be " + range + ", found " + n.text);
      return false;
    }
    get(*c.exp) = v;
    return true;
  };
  r.print = [get](const Experiment& e) { return format_double(get(e)); };
  return r;
}

template <class Get>
KeyRule bool_key(std::string path, std::string def, std::string meaning, Get get) {
  KeyRule r;
  r.spec = {std::move(path), "bool", std::move(def), std::move(meaning)};
  r.read = [get](const Node& n, const std::string& key, WalkContext& c) {
    return read_bool(n, key, c, &get(*c.exp));
  };
  r.print = [get](const Experiment& e) { return std::string(get(e) ? "true" : "false"); };
  return r;
}

template <class Get>
KeyRule string_key(std::string path, std::string def, std::string meaning, Get get) {
  KeyRule r;
  r.spec = {std::move(path), "string", std::move(def), std::move(meaning)};
  r.read = [get](const Node& n, const std::string& key, WalkContext& c) {
    return read_string(n, key, c, &get(*c.exp));
  };
  r.print = [get](const Experiment& e) { return quote(get(e)); };
  return r;
}

template <class E, class Get>
KeyRule enum_key(std::string path, const Names<E>& names, std::string def, std::string meaning, Get get) {
  KeyRule r;
  r.spec = {std::move(path), "enum: " + join_names(names, " | "), std::move(def), std::move(meaning)};
  r.read = [get, &names](const Node& n, const std::string& key, WalkContext& c) {
    return read_enum(n, key, c, names, &get(*c.exp));
  };
  r.print = [get, &names](const Experiment& e) { return std::string(name_of(names, get(e))); };
  return r;
}

template <class Get>
KeyRule string_list_key(std::string path, std::string meaning, Get get) {
  KeyRule r;
  r.spec = {std::move(path), "list of strings", "[]", std::move(meaning)};
  r.read = [get](const Node& n, const std::string& key, WalkContext& c) {
    if (!n.is_sequence()) {
      c.error(n, key, "expected a list of strings, found " + describe(n));
      return false;
    }
    std::vector<std::string> out(n.items.size());
    bool ok = true;
    for (size_t i = 0; i < n.items.size(); ++i) {
      ok = read_string(*n.items[i], key, c, &out[i], "entry " + std::to_string(i) + ": ") && ok;
    }
    if (ok) get(*c.exp) = std::move(out);
    return ok;
  };
  r.print = [get](const Experiment& e) {
    std::string s = "[";
    for (size_t i = 0; i < get(e).size(); ++i) s += (i ? ", " : "") + quote(get(e)[i]);
    return s + "]";
  };
  return r;
}

// "~/x" -> "$HOME/x", as a shell would; anything else as written.
std::string expand_home(const std::string& text) {
  const char* home = std::getenv("HOME");
  if (home && *home && (text == "~" || text.rfind("~/", 0) == 0)) return std::string(home) + text.substr(1);
  return text;
}

KeyRule weights_file_key() {
  KeyRule r;
  r.spec = {"model.weights.file", "path", "none",
            "safetensors file with the model's weights; relative to the YAML file it is written in"};
  r.nullable = true;
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    std::string text;
    if (!read_string(n, key, c, &text)) return false;
    if (text.empty()) {
      c.error(n, key, "expected a path, found \"\"", "remove the key, or write the file's path");
      return false;
    }
    namespace fs = std::filesystem;
    fs::path p = fs::path(c.dir_of(n)) / expand_home(text);  // an absolute `text` replaces the directory
    std::string abs = p.lexically_normal().string();
    std::error_code ec;
    const fs::file_status st = fs::status(abs, ec);
    if (!fs::exists(st)) {
      c.error(c.where(key), key, "file not found: " + abs,
              "a relative path is resolved against the directory of the YAML file that names it");
      return false;
    }
    if (!fs::is_regular_file(st)) {
      c.error(c.where(key), key, "not a regular file: " + abs);
      return false;
    }
    c.exp->model.weights.file = abs;
    c.exp->model.weights.file_where = c.where(key);
    return true;
  };
  r.print = [](const Experiment& e) {
    return e.model.weights.file.empty() ? std::string("null") : quote(e.model.weights.file);
  };
  return r;
}

// model.head.tasks: a list of {name, plugin, labels}. Each entry's shape is checked here; the
// tasks against each other and the head (labels in two tasks, n_classes) in resolve, and each
// task's plugin against the experiment's plugins in check_plugins_fit (core/src/run/preview.cpp).
KeyRule head_tasks_key() {
  KeyRule r;
  r.spec = {"model.head.tasks", "list of {name, plugin, labels}", "[]",
            "classifier: its classes grouped into tasks, each with its own block of the classifier (its own "
            "head): `labels` are the task's classes, `plugin` the plugin whose items it labels; an item's softmax, "
            "loss and prediction run over its task's classes only, and evaluation reports each task. The head's "
            "labels are then the tasks' labels in order (n_classes their count)"};
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    if (!n.is_sequence()) {
      c.error(n, key, "expected a list of tasks (- {name: ..., plugin: ..., labels: [...]}), found " + describe(n));
      return false;
    }
    bool ok = true;
    std::vector<HeadTask> tasks;
    for (size_t i = 0; i < n.items.size(); ++i) {
      const Node& item = *n.items[i];
      const std::string at = key + "[" + std::to_string(i) + "]";
      if (!item.is_map()) {
        c.error(item, at, "expected a mapping (name:, plugin:, labels:), found " + describe(item));
        ok = false;
        continue;
      }
      HeadTask t;
      t.where = item.pos.location();
      bool have_name = false, have_plugin = false, have_labels = false;
      for (const MapEntry& e : item.entries) {
        if (e.key == "name") {
          have_name = read_string(*e.value, at + ".name", c, &t.name) || (ok = false);
        } else if (e.key == "plugin") {
          have_plugin = read_string(*e.value, at + ".plugin", c, &t.plugin) || (ok = false);
        } else if (e.key == "labels") {
          if (!e.value->is_sequence() || e.value->items.empty()) {
            c.error(*e.value, at + ".labels", "expected a non-empty list of class names, found " + describe(*e.value));
            ok = false;
            continue;
          }
          t.labels.resize(e.value->items.size());
          have_labels = true;
          for (size_t j = 0; j < e.value->items.size(); ++j)
            if (!read_string(*e.value->items[j], at + ".labels", c, &t.labels[j], "entry " + std::to_string(j) + ": "))
              ok = have_labels = false;
        } else {
          const std::string near = nearest(e.key, {"name", "plugin", "labels"});
          c.error(e.key_pos.location(), at + "." + e.key, "unknown key",
                  near.empty() ? "valid keys: name, plugin, labels" : "did you mean `" + near + "`?");
          ok = false;
        }
      }
      for (const auto& [have, what, hint] :
           {std::tuple{have_name, "name", "add `name: <task>`"},
            std::tuple{have_plugin, "plugin", "add `plugin: <name>`, one of the experiment's plugins"},
            std::tuple{have_labels, "labels", "add `labels: [<class>, ...]`"}})
        if (!have && ok) {
          c.error(item, at, std::string("missing key `") + what + "`", hint);
          ok = false;
        }
      tasks.push_back(std::move(t));
    }
    if (ok) c.exp->model.head.tasks = std::move(tasks);
    return ok;
  };
  r.print = [](const Experiment& e) {
    const auto& tasks = e.model.head.tasks;
    if (tasks.empty()) return std::string("[]");
    std::string s = "[";
    for (size_t i = 0; i < tasks.size(); ++i) {
      s += (i ? ", " : "") + std::string("{name: ") + quote(tasks[i].name) + ", plugin: " + quote(tasks[i].plugin) +
           ", labels: [";
      for (size_t j = 0; j < tasks[i].labels.size(); ++j) s += (j ? ", " : "") + quote(tasks[i].labels[j]);
      s += "]}";
    }
    return s + "]";
  };
  return r;
}

KeyRule inline_weights_key() {
  KeyRule r;
  r.spec = {"model.weights.inline", "map: name -> matrix or vector", "{}",
            "tensors written in the YAML itself, by name; entries are numbers or expressions"};
  r.open_map = true;
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    if (!n.is_map()) {
      c.error(n, key, "expected a mapping of tensor names to matrices or vectors, found " + describe(n));
      return false;
    }
    bool ok = true;
    for (const MapEntry& e : n.entries) {
      const std::string path = key + "." + e.key;
      c.exp->locations[path] = e.key_pos.location();
      InlineTensor t;
      t.where = e.key_pos.location();
      if (!read_tensor(*e.value, path, c, /*allow_vector=*/true, &t.value)) {
        ok = false;
        continue;
      }
      c.exp->model.weights.inline_tensors[e.key] = std::move(t);
    }
    return ok;
  };
  r.print = [](const Experiment& e) {
    if (e.model.weights.inline_tensors.empty()) return std::string("{}");
    std::string out;
    for (const auto& [name, t] : e.model.weights.inline_tensors) {
      std::string value = print_tensor(t.value);
      if (value[0] == '\n') {
        std::string indented;
        for (char ch : value) indented += ch == '\n' ? std::string("\n  ") : std::string(1, ch);
        out += '\n';
        out += key_text(name);
        out += ':';
        out += indented;
      } else {
        out += '\n';
        out += key_text(name);
        out += ": ";
        out += value;
      }
    }
    return out;
  };
  return r;
}

KeyRule attention_scale_key() {
  KeyRule r;
  r.spec = {"model.attention.scale", "float > 0 or auto", "auto",
            "factor applied to the scores q·k; auto is 1 / sqrt(d_k)"};
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    if (n.is_scalar() && n.text == "auto") {
      c.exp->model.attention.scale = 0.0;  // resolved from d_k
      return true;
    }
    return read_positive_float(n, key, c, &c.exp->model.attention.scale, "a float > 0 or auto");
  };
  r.print = [](const Experiment& e) { return format_double(e.model.attention.scale); };
  return r;
}

KeyRule input_rows_key() {
  KeyRule r;
  r.spec = {"input.rows", "matrix", "none",
            "input rows (T, F) for stem.kind features or identity; entries are numbers or expressions"};
  r.nullable = true;
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    return read_tensor(n, key, c, /*allow_vector=*/false, &c.exp->input.rows);
  };
  r.print = [](const Experiment& e) {
    return e.input.rows.defined() ? print_tensor(e.input.rows) : std::string("null");
  };
  return r;
}

KeyRule input_ids_key() {
  KeyRule r;
  r.spec = {"input.ids", "list of ints >= 0", "[]", "input token ids for stem.kind tokens"};
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    if (!n.is_sequence()) {
      c.error(n, key, "expected a list of ints, found " + describe(n));
      return false;
    }
    const IntBound bound{0, ">= 0", std::numeric_limits<int32_t>::max()};
    std::vector<int32_t> ids(n.items.size());
    bool ok = true;
    for (size_t i = 0; i < n.items.size(); ++i) {
      int64_t v = 0;
      if (read_int(*n.items[i], key, c, bound, &v, "entry " + std::to_string(i) + ": ")) {
        ids[i] = static_cast<int32_t>(v);
      } else {
        ok = false;
      }
    }
    if (ok) c.exp->input.ids = std::move(ids);
    return ok;
  };
  r.print = [](const Experiment& e) {
    std::string s = "[";
    for (size_t i = 0; i < e.input.ids.size(); ++i) s += (i ? ", " : "") + std::to_string(e.input.ids[i]);
    return s + "]";
  };
  return r;
}


// A list of ints written as a YAML sequence.
KeyRule int_list_key(std::string path, IntBound b, std::string meaning, std::vector<int64_t> TaskConfig::*dummy,
                     std::function<std::vector<int64_t>&(Experiment&)> get,
                     std::function<const std::vector<int64_t>&(const Experiment&)> cget) {
  (void)dummy;
  KeyRule r;
  r.spec = {std::move(path), "list of ints" + b.type().substr(3), "[]", std::move(meaning)};
  r.read = [get, b](const Node& n, const std::string& key, WalkContext& c) {
    if (!n.is_sequence()) {
      c.error(n, key, "expected a list of ints, found " + describe(n));
      return false;
    }
    std::vector<int64_t> v(n.items.size());
    bool ok = true;
    for (size_t i = 0; i < n.items.size(); ++i)
      ok = read_int(*n.items[i], key, c, b, &v[i], "entry " + std::to_string(i) + ": ") && ok;
    if (ok) get(*c.exp) = std::move(v);
    return ok;
  };
  r.print = [cget](const Experiment& e) {
    std::string s = "[";
    for (size_t i = 0; i < cget(e).size(); ++i) s += (i ? ", " : "") + std::to_string(cget(e)[i]);
    return s + "]";
  };
  return r;
}

// A path resolved against the directory of the YAML file it is written in (a leading ~/ is the
// home directory); must exist when `must_exist`. Stored absolute.
bool read_path(const Node& n, const std::string& key, WalkContext& c, bool must_exist, std::string* out) {
  std::string text;
  if (!read_string(n, key, c, &text)) return false;
  text = expand_home(text);
  if (text.empty()) {
    c.error(n, key, "expected a path, found \"\"");
    return false;
  }
  namespace fs = std::filesystem;
  const std::string abs = (fs::path(c.dir_of(n)) / text).lexically_normal().string();
  std::error_code ec;
  if (must_exist && !fs::exists(abs, ec)) {
    c.error(n, key, "not found: " + abs, "a relative path is resolved against the directory of the YAML file that names it");
    return false;
  }
  *out = abs;
  return true;
}

KeyRule model_path_key() {
  KeyRule r;
  r.spec = {"model.path", "path", "none",
            "from: hf: the Hugging Face model folder (config.json, model.safetensors or shards with their index, "
            "tokenizer or preprocessor files); relative to the YAML file"};
  r.nullable = true;
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    std::string p;
    if (!read_path(n, key, c, true, &p)) return false;
    if (!std::filesystem::is_directory(p)) {
      c.error(n, key, "not a directory: " + p, "model.path names a Hugging Face model folder");
      return false;
    }
    c.exp->model.path = p;
    return true;
  };
  r.print = [](const Experiment& e) { return e.model.path.empty() ? std::string("null") : quote(e.model.path); };
  return r;
}

KeyRule data_path_key() {
  KeyRule r;
  r.spec = {
      "data.path", "path", "none",
      "the dataset: a directory, a glob (data/*.jpg), a manifest (.csv, .jsonl), a FASTA file, an IDX image "
      "file (MNIST's) or a text file; relative to the YAML file"};
  r.nullable = true;
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    std::string p;
    const std::string text = n.is_scalar() ? n.text : "";
    const bool glob = text.find_first_of("*?[") != std::string::npos;
    if (!read_path(n, key, c, !glob, &p)) return false;
    c.exp->data.path = p;
    c.exp->data.where = c.where(key);
    return true;
  };
  r.print = [](const Experiment& e) { return e.data.path.empty() ? std::string("null") : quote(e.data.path); };
  return r;
}

// A dataset path of the train section (validation_data, test_data): like data.path, a glob or a
// path that must exist; or (globs false: validation_labels, test_labels) a file that must exist.
KeyRule train_data_key(const std::string& path, std::string TrainConfig::*field, const std::string& meaning,
                       bool globs = true) {
  KeyRule r;
  r.spec = {path, "path", "none", meaning};
  r.nullable = true;
  r.read = [field, globs](const Node& n, const std::string& key, WalkContext& c) {
    const std::string text = n.is_scalar() ? n.text : "";
    const bool glob = globs && text.find_first_of("*?[") != std::string::npos;
    return read_path(n, key, c, !glob, &(c.exp->train.*field));
  };
  r.print = [field](const Experiment& e) {
    const std::string& v = e.train.*field;
    return v.empty() ? std::string("null") : quote(v);
  };
  return r;
}

KeyRule data_labels_key() {
  KeyRule r;
  r.spec = {
      "data.labels", "path", "none",
      "idx: the labels file (idx1, one u8 per image) of data.path's images, the items' labels; relative to "
      "the YAML file"};
  r.nullable = true;
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    return read_path(n, key, c, true, &c.exp->data.labels);
  };
  r.print = [](const Experiment& e) {
    return e.data.labels.empty() ? std::string("null") : quote(e.data.labels);
  };
  return r;
}

void append_train_keys(std::vector<KeyRule>& r);

KeyRule task_labels_key() {
  KeyRule r;
  r.spec = {"task.labels", "path", "none",
            "classify: class names, one per line (else model.head.labels, else class numbers)"};
  r.nullable = true;
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    return read_path(n, key, c, true, &c.exp->task.labels);
  };
  r.print = [](const Experiment& e) { return e.task.labels.empty() ? std::string("null") : quote(e.task.labels); };
  return r;
}

// A plugin option's canonical text as YAML that reads back to the same value.
std::string plugin_option_yaml(const std::string& v, int type) {
  switch (type) {
    case TSR_OPT_BOOL:
    case TSR_OPT_INT:
    case TSR_OPT_FLOAT: return v;
    case TSR_OPT_FLOAT_LIST:
    case TSR_OPT_INT_LIST: {
      std::string s = "[";
      for (char ch : v) s += ch == ',' ? std::string(", ") : std::string(1, ch);
      return s + "]";
    }
    default: return quote(v);
  }
}

// One plugin option's YAML value, checked against the plugin's declaration, as canonical text.
bool read_plugin_option(const Node& n, const std::string& key, WalkContext& c, const PluginOptionSpec& o,
                        std::string* out) {
  switch (o.type) {
    case TSR_OPT_BOOL: {
      bool b = false;
      if (!read_bool(n, key, c, &b)) return false;
      *out = b ? "true" : "false";
      return true;
    }
    case TSR_OPT_INT: {
      int64_t v = 0;
      if (!read_int(n, key, c, {std::numeric_limits<int64_t>::min(), "any"}, &v)) return false;
      *out = std::to_string(v);
      return true;
    }
    case TSR_OPT_FLOAT: {
      double v = 0;
      if (!n.is_scalar() || !n.plain || !parse_float_text(n.text, &v) || !std::isfinite(v)) {
        c.error(n, key, "expected a float, found " + describe(n));
        return false;
      }
      *out = format_double(v);
      return true;
    }
    case TSR_OPT_STRING: return read_string(n, key, c, out);
    case TSR_OPT_PATH: return read_path(n, key, c, true, out);
    case TSR_OPT_ENUM: {
      std::string v;
      if (!read_string(n, key, c, &v)) return false;
      if (std::find(o.choices.begin(), o.choices.end(), v) == o.choices.end()) {
        std::string list;
        for (const std::string& ch : o.choices) list += (list.empty() ? "" : ", ") + ch;
        const std::string near = nearest(v, o.choices);
        c.error(n, key, "\"" + v + "\" is not one of " + list, near.empty() ? "" : "did you mean `" + near + "`?");
        return false;
      }
      *out = v;
      return true;
    }
    case TSR_OPT_FLOAT_LIST:
    case TSR_OPT_INT_LIST: {
      const bool ints = o.type == TSR_OPT_INT_LIST;
      std::vector<const Node*> items;
      if (n.is_sequence()) {
        for (const NodePtr& it : n.items) items.push_back(it.get());
      } else {
        items.push_back(&n);  // one number stands for a list of one
      }
      std::string text;
      for (size_t i = 0; i < items.size(); ++i) {
        const std::string entry = "entry " + std::to_string(i) + ": ";
        std::string v;
        if (ints) {
          int64_t x = 0;
          if (!read_int(*items[i], key, c, {std::numeric_limits<int64_t>::min(), "any"}, &x, entry)) return false;
          v = std::to_string(x);
        } else {
          double x = 0;
          if (!items[i]->is_scalar() || !items[i]->plain || !parse_float_text(items[i]->text, &x) || !std::isfinite(x)) {
            c.error(*items[i], key, entry + "expected a float, found " + describe(*items[i]));
            return false;
          }
          v = format_double(x);
        }
        text += (i ? "," : "") + v;
      }
      if (items.empty()) {
        c.error(n, key, "expected a list of numbers, found an empty list");
        return false;
      }
      *out = text;
      return true;
    }
  }
  return false;
}

KeyRule plugins_key() {
  KeyRule r;
  r.spec = {"plugins", "list of {name, path, options}", "[]",
            "the modality plugins that turn each item into token rows, in sequence order; each names a plugin "
            "(libtessera_<name>.so on the plugin search path), optionally its file or folder (`path`, relative to "
            "the YAML file), and its options (listed by `tessera plugins --options`)"};
  // The shape of each entry is checked here; finding and loading the plugins and checking their
  // options against what each declares is the resolve layer's (core/src/resolve/), which calls
  // read_plugin_options with the loaded plugin's option list.
  r.read = [](const Node& n, const std::string& key, WalkContext& c) {
    if (!n.is_sequence()) {
      c.error(n, key, "expected a list of plugins (- name: text ...), found " + describe(n));
      return false;
    }
    bool ok = true;
    std::vector<PluginRequest> requests;
    for (size_t i = 0; i < n.items.size(); ++i) {
      const Node& item = *n.items[i];
      PluginRequest q;
      q.at = key + "[" + std::to_string(i) + "]";
      const std::string& at = q.at;
      if (!item.is_map()) {
        c.error(item, at, "expected a mapping (name:, path:, options:), found " + describe(item));
        ok = false;
        continue;
      }
      q.item = &item;
      q.config.where = item.pos.location();
      for (const MapEntry& e : item.entries) {
        if (e.key == "name")
          q.name = e.value.get();
        else if (e.key == "path")
          q.path = e.value.get();
        else if (e.key == "options")
          q.options = e.value.get();
        else {
          const std::string near = nearest(e.key, {"name", "path", "options"});
          c.error(e.key_pos.location(), at + "." + e.key, "unknown key",
                  near.empty() ? "valid keys: name, path, options" : "did you mean `" + near + "`?");
          ok = false;
        }
      }
      if (!q.name) {
        c.error(item, at, "missing key `name`", "add `name: <plugin>` (see `tessera plugins`)");
        ok = false;
        continue;
      }
      if (!read_string(*q.name, at + ".name", c, &q.config.name)) {
        ok = false;
        continue;
      }
      if (q.path && !q.path->is_null()) {
        std::string p;
        if (!read_path(*q.path, at + ".path", c, true, &p)) {
          ok = false;
          continue;
        }
        if (std::filesystem::is_directory(p))
          q.dirs.push_back(p);
        else
          q.config.file = p;
      }
      if (q.options && !q.options->is_null() && !q.options->is_map()) {
        c.error(*q.options, at + ".options", "expected a mapping of options, found " + describe(*q.options));
        ok = false;
        continue;
      }
      requests.push_back(std::move(q));
    }
    // The well-formed entries are resolved even when others are not, so that every problem is
    // reported at once; the experiment gets plugins only when all of them are fine.
    c.plugin_requests = std::move(requests);
    return ok;
  };
  r.print = [](const Experiment& e) {
    if (e.plugins.empty()) return std::string("[]");
    std::string s;
    for (const PluginConfig& p : e.plugins) {
      s += "\n- name: " + quote(p.name) + "\n  path: " + quote(p.file) + "\n  options:";
      if (p.options.empty()) s += " {}";
      for (size_t i = 0; i < p.options.size(); ++i)
        s += "\n    " + p.options[i].first + ": " + plugin_option_yaml(p.options[i].second, p.option_types[i]);
    }
    return s;
  };
  return r;
}

KeyRule include_key() {
  KeyRule r;
  r.spec = {"model.include", "path", "none",
            "a YAML file whose top-level `model:` is taken; keys written beside include override it"};
  return r;  // resolved by the loader before the walk; a resolved experiment includes nothing
}

std::vector<KeyRule> build_rules() {
  std::vector<KeyRule> r;
  r.push_back(include_key());
  r.push_back(string_key("model.name", "\"\"", "a name for reports", FIELD(model.name)));
  r.push_back(enum_key("model.from", kSourceNames, "tessera",
                       "tessera: the keys below describe the model; hf: a Hugging Face model folder (model.path) "
                       "gives the architecture, weights and plugin options, and only name, dtype, head and "
                       "runtime keys may be set beside it",
                       FIELD(model.source)));
  r.push_back(model_path_key());
  r.push_back(enum_key("model.arch", kArchNames, "encoder", "encoder or decoder stack", FIELD(model.arch)));
  r.push_back(bool_key("model.causal", "true if arch is decoder, else false",
                       "each row attends only to itself and earlier rows", FIELD(model.causal)));
  r.push_back(int_key("model.d_model", kWidthBound, "required", "width of every row between blocks (C)",
                      FIELD(model.d_model)));
  r.push_back(int_key("model.n_layers", upto(kAtLeastOne, limits::kLayers, kWhyLayers), "1",
                      "number of blocks", FIELD(model.n_layers)));
  r.push_back(
      int_key("model.n_heads", kHeadsBound, "1", "attention heads per block (H)", FIELD(model.n_heads)));
  r.push_back(int_key("model.d_k", kWidthBound, "d_model / n_heads", "query and key width of each head (D)",
                      FIELD(model.d_k)));
  r.push_back(
      int_key("model.d_v", kWidthBound, "d_model / n_heads", "value width of each head", FIELD(model.d_v)));
  r.push_back(int_key("model.d_ff", upto(kNonNegative, limits::kHidden, kWhyHidden), "4 * d_model",
                      "hidden width of the feed-forward sublayer; 0 = no feed-forward sublayer",
                      FIELD(model.d_ff)));
  r.push_back(enum_key("model.activation", kActivationNames, "relu",
                       "feed-forward activation; gelu is the exact erf GELU, gelu_tanh GPT-2's",
                       FIELD(model.activation)));
  r.push_back(enum_key("model.norm", kNormNames, "post",
                       "layer norm after each residual add (post, 2017), before each sublayer (pre), or none",
                       FIELD(model.norm)));
  r.push_back(float_key("model.norm_eps", "1e-05", "epsilon of every layer norm", FIELD(model.norm_eps)));
  r.push_back(bool_key("model.final_norm", "true if norm is pre, else false",
                       "a layer norm after the last block; needs norm pre or post", FIELD(model.final_norm)));
  r.push_back(bool_key("model.bias", "true", "biases in every linear layer", FIELD(model.bias)));
  r.push_back(bool_key("model.residual", "true",
                       "residual connections around each sublayer (post and none; pre-LN blocks always have them)",
                       FIELD(model.residual)));
  r.push_back(enum_key("model.dtype", kDTypeNames, "f32", "compute precision of the matmuls", FIELD(model.dtype)));
  r.push_back(attention_scale_key());
  r.push_back(bool_key("model.attention.output_projection", "true",
                       "W_O after the heads; false needs n_heads * d_v = d_model, or a single layer "
                       "with head.kind none and residual false",
                       FIELD(model.attention.output_projection)));
  r.push_back(enum_key("model.positions.kind", kPositionNames, "none", "how row positions enter the model",
                       FIELD(model.positions.kind)));
  r.push_back(int_key("model.positions.max_len", upto(kPositive, limits::kSequence, kWhySequence), "512",
                      "longest sequence: rows of the learned table, limit for sinusoidal",
                      FIELD(model.positions.max_len)));
  r.push_back(int_key("model.positions.max_distance", upto(kPositive, limits::kDistance, kWhyTable), "16",
                      "relative only: offsets are clipped to [-max_distance, max_distance]",
                      FIELD(model.positions.max_distance)));
  r.push_back(float_key("model.positions.base", "10000", "frequency base of sinusoidal and rotary positions",
                        FIELD(model.positions.base)));
  r.push_back(int_key("model.positions.rotary_dims", kWidthBound, "d_k",
                      "rotary only: leading dims of each head that are rotated; even, at most d_k",
                      FIELD(model.positions.rotary_dims)));
  r.push_back(enum_key("model.positions.rotary_style", kRotaryNames, "half",
                       "rotary only: pairs (i, i + d/2) or (2i, 2i + 1)", FIELD(model.positions.rotary_style)));
  r.push_back(enum_key("model.stem.kind", kStemNames, "tokens",
                       "input rows: token ids looked up in a table, feature rows projected to d_model, "
                       "rows already d_model wide, or mixed (token and feature rows in one sequence)",
                       FIELD(model.stem.kind)));
  r.push_back(int_key("model.stem.vocab_size", kVocabBound, "required if kind is tokens or mixed",
                      "rows of the token embedding table (V)", FIELD(model.stem.vocab_size), true));
  r.push_back(int_key("model.stem.n_features", upto(kPositive, limits::kHidden, kWhyHidden),
                      "required if kind is features or mixed", "width of each feature row",
                      FIELD(model.stem.n_features), true));
  r.push_back(bool_key("model.stem.cls", "false",
                       "features, mixed: a learned CLS row (rows whose role is CLS, or one prepended row)",
                       FIELD(model.stem.cls)));
  r.push_back(enum_key("model.stem.scale", kEmbedScaleNames, "none",
                       "multiply the stem's rows by sqrt(d_model), as in 2017", FIELD(model.stem.scale)));
  r.push_back(int_key("model.stem.token_types", upto(kNonNegative, limits::kTable, kWhyTable), "0",
                      "tokens, mixed: rows of a learned token-type embedding added to each token row (BERT)",
                      FIELD(model.stem.token_types)));
  r.push_back(bool_key("model.stem.norm", "false", "a layer norm over the stem's rows after positions (BERT)",
                       FIELD(model.stem.norm)));
  r.push_back(bool_key("model.stem.dist", "false",
                       "with cls: a learned distillation row after the CLS row (DeiT, AST)", FIELD(model.stem.dist)));
  r.push_back(bool_key("model.stem.token_dropout", "false",
                       "ESM-2: zero the mask token's rows and rescale each sequence by its masked share",
                       FIELD(model.stem.token_dropout)));
  r.push_back(int_key("model.stem.mask_id", upto({-1, ">= -1"}, limits::kVocab, kWhyVocab), "-1",
                      "token_dropout: the mask token's id", FIELD(model.stem.mask_id)));
  r.push_back(int_key("model.stem.modalities", upto(kNonNegative, limits::kTable, kWhyTable), "0",
                      "> 0: a learned embedding per modality (per plugin, in order), added to each row",
                      FIELD(model.stem.modalities)));
  r.push_back(enum_key("model.head.kind", kHeadNames, "none",
                       "what follows the blocks: nothing, a pooled vector, class logits, or next-token logits",
                       FIELD(model.head.kind)));
  r.push_back(enum_key("model.head.pool", kPoolNames, "cls if stem.cls, else mean",
                       "how rows are pooled for pool and classifier heads (max: each channel's largest value over the "
                       "rows); cls needs stem.cls",
                       FIELD(model.head.pool)));
  r.push_back(bool_key("model.head.normalize", "false", "L2-normalise the pooled vector", FIELD(model.head.normalize)));
  r.push_back(int_key("model.head.n_classes", kVocabBound, "required if kind is classifier (without tasks)",
                      "number of classes", FIELD(model.head.n_classes), true));
  r.push_back(string_list_key("model.head.labels", "class names; if given, n_classes of them", FIELD(model.head.labels)));
  r.push_back(head_tasks_key());
  r.push_back(bool_key("model.head.tied", "true",
                       "lm only: logits through the token embedding table; needs stem.kind tokens",
                       FIELD(model.head.tied)));
  r.push_back(bool_key("model.head.lm_bias", "false",
                       "lm, tied: a learned bias over the vocabulary (untied heads have one when model.bias)",
                       FIELD(model.head.lm_bias)));
  r.push_back(bool_key("model.head.pooler", "false",
                       "pool, classifier: a dense layer with tanh on the pooled vector (BERT's and ViT's pooler)",
                       FIELD(model.head.pooler)));
  r.push_back(bool_key("model.head.norm", "false", "classifier: a layer norm on the pooled vector first (AST)",
                       FIELD(model.head.norm)));
  r.push_back(bool_key("model.head.transform", "false",
                       "lm: dense, activation and layer norm before the vocabulary projection (BERT MLM, ESM-2)",
                       FIELD(model.head.transform)));
  r.push_back(enum_key("model.init.scheme", kInitNames, "glorot_normal",
                       "initialisation of weights that are not loaded", FIELD(model.init.scheme)));
  r.push_back(float_key("model.init.std", "0.02", "standard deviation for scheme normal", FIELD(model.init.std)));
  r.push_back(int_key("model.init.seed", kNonNegative, "0", "seed of the initialisation", FIELD(model.init.seed)));
  r.push_back(weights_file_key());
  r.push_back(inline_weights_key());
  r.push_back(bool_key("model.weights.allow_missing", "false if weights.file is given, else true",
                       "initialise tensors that no weights source provides", FIELD(model.weights.allow_missing)));
  r.push_back(string_list_key("model.weights.ignore",
                              "tensors of weights.file not read, by name or by a prefix ending at a dot ([head]: a "
                              "pretrained LM head's tensors under a new classifier head); each entry must name one of "
                              "the file's tensors; without weights.file, nothing",
                              FIELD(model.weights.ignore)));
  r.push_back(string_list_key("input.tokens", "labels of the input rows, for display", FIELD(input.tokens)));
  r.push_back(input_rows_key());
  r.push_back(input_ids_key());
  r.push_back(int_key("runtime.threads", kThreadsBound, "0", "intra-op threads; 0 = all cores",
                      FIELD(runtime.threads)));
  r.push_back(bool_key("runtime.reference", "false", "run the reference loops instead of oneDNN (slow; for checking)",
                       FIELD(runtime.reference)));
  r.push_back(int_key("runtime.batch_size", kBatchBound, "8", "tessera run: items per forward pass",
                      FIELD(runtime.batch_size)));
  r.push_back(bool_key("runtime.packing", "false",
                       "tessera run: pack several sequences into each batch row instead of padding them",
                       FIELD(runtime.packing)));
  r.push_back(int_key("runtime.workers", kThreadsBound, "1",
                      "tessera run: threads decoding items with the plugins while the model runs; 0 = none",
                      FIELD(runtime.workers)));
  r.push_back(bool_key("runtime.isolate", "true",
                       "tessera run and train: plugins encode in worker processes, so an item that crashes, hangs or "
                       "floods a plugin is one bad item (docs/RELIABILITY.md)",
                       FIELD(runtime.isolate)));
  r.push_back(float_range_key("runtime.item_timeout_s", "in [0, 1e7]", [](double v) { return v >= 0 && v <= 1e7; },
                              "120", "tessera run and train, isolate: seconds one item may take in a worker; 0 = no limit",
                              FIELD(runtime.item_timeout_s)));
  r.push_back(int_key("runtime.worker_memory_mb", kItemBound, "8192",
                      "tessera run and train, isolate: MiB of address space a worker may add while encoding; 0 = no limit",
                      FIELD(runtime.worker_memory_mb)));
  r.push_back(int_key("runtime.max_item_bytes", kItemBound, "1073741824",
                      "tessera run and train: bytes of input one item may have; 0 = no limit", FIELD(runtime.max_item_bytes)));
  r.push_back(int_key("runtime.max_item_rows", kItemBound, "8388608",
                      "tessera run and train: token rows all of one item's sequences may have; 0 = no limit",
                      FIELD(runtime.max_item_rows)));
  r.push_back(plugins_key());
  r.push_back(data_path_key());
  r.push_back(enum_key(
      "data.format", kDataFormatNames, "auto",
      "how to read data.path; auto: a directory, a glob, .csv/.jsonl manifests, "
      ".fasta/.fa/.faa/.fas/.fna/.ffn, IDX images (-idx3-ubyte, -idx3-ubyte.gz, .idx), else lines of "
      "text",
      FIELD(data.format)));
  r.push_back(int_key("data.limit", kNonNegative, "0", "read at most this many items; 0 = all", FIELD(data.limit)));
  r.push_back(bool_key("data.allow_missing", "false",
                       "manifests with several plugins: an item may leave some plugins' columns empty and is "
                       "encoded from the inputs it has (at least one); false: such an item is a bad item",
                       FIELD(data.allow_missing)));
  r.push_back(data_labels_key());
  r.push_back(string_list_key("data.label_names",
                              "idx, with data.labels: the name of each label value (label 0 is the first); "
                              "labels are then these names, else the values as numbers",
                              FIELD(data.label_names)));
  r.push_back(enum_key("task.kind", kTaskNames, "embed",
                       "embed: one pooled vector per item; hidden: every row's state; classify: top-k classes; "
                       "score: next-token probabilities and the sequence's log-likelihood; generate: continue "
                       "each item's text (task.generate)",
                       FIELD(task.kind)));
  r.push_back(int_key("task.top_k", upto(kAtLeastOne, limits::kVocab, kWhyVocab), "5",
                      "classify, score: how many classes or tokens to report", FIELD(task.top_k)));
  r.push_back(task_labels_key());
  r.push_back(int_list_key(
      "task.attention.layers", upto(kNonNegative, limits::kLayers, kWhyLayers),
      "export the attention weights of these layers", nullptr,
      [](Experiment& e) -> std::vector<int64_t>& { return e.task.attention.layers; },
      [](const Experiment& e) -> const std::vector<int64_t>& { return e.task.attention.layers; }));
  r.push_back(int_list_key(
      "task.attention.heads", upto(kNonNegative, limits::kHeads, kWhyHeads),
      "of these heads; [] = every head", nullptr,
      [](Experiment& e) -> std::vector<int64_t>& { return e.task.attention.heads; },
      [](const Experiment& e) -> const std::vector<int64_t>& { return e.task.attention.heads; }));
  r.push_back(bool_key("task.attention.png", "true", "also draw each exported map as a PNG heatmap",
                       FIELD(task.attention.png)));
  r.push_back(int_key("task.generate.max_new_tokens", kSequenceBound, "32",
                      "generate: most new tokens per item (fewer where positions.max_len runs out)",
                      FIELD(task.generate.max_new_tokens)));
  r.push_back(float_range_key("task.generate.temperature", ">= 0", [](double v) { return v >= 0; }, "0",
                              "generate: 0 picks the most likely token (greedy); > 0 samples from the "
                              "logits divided by it",
                              FIELD(task.generate.temperature)));
  r.push_back(int_key("task.generate.top_k", upto(kNonNegative, limits::kVocab, kWhyVocab), "0",
                      "generate, sampling: only the k most likely tokens; 0 = all",
                      FIELD(task.generate.top_k)));
  r.push_back(float_range_key("task.generate.top_p", "in (0, 1]", [](double v) { return v > 0 && v <= 1; }, "1",
                              "generate, sampling: only the most likely tokens whose probabilities add up to "
                              "top_p (nucleus); 1 = all",
                              FIELD(task.generate.top_p)));
  r.push_back(float_key("task.generate.repetition_penalty", "1",
                        "generate: logits of tokens already in the sequence (prompt included) divided by it when "
                        "positive, multiplied when negative; 1 = none",
                        FIELD(task.generate.repetition_penalty)));
  r.push_back(int_key("task.generate.seed", kNonNegative, "0",
                      "generate, sampling: each item draws from its own generator with this seed",
                      FIELD(task.generate.seed)));
  r.push_back(string_list_key("task.generate.stop",
                              "generate: an item stops when its completion contains one of these; the "
                              "completion is cut before it",
                              FIELD(task.generate.stop)));
  r.push_back(int_list_key(
      "task.generate.stop_ids", upto(kNonNegative, limits::kVocab, kWhyVocab),
      "generate: an item stops after generating one of these tokens (e.g. GPT-2's 50256), with "
      "finish_reason stop; the plugin's own EOS, when it ends the prompt, stops it with eos",
      nullptr, [](Experiment& e) -> std::vector<int64_t>& { return e.task.generate.stop_ids; },
      [](const Experiment& e) -> const std::vector<int64_t>& { return e.task.generate.stop_ids; }));
  r.push_back(string_key("outputs.dir", "runs/<experiment name>",
                         "the run folder, relative to the current directory", FIELD(outputs.dir)));
  r.push_back(bool_key("outputs.provenance", "true", "write each row's provenance (rows.jsonl)",
                       FIELD(outputs.provenance)));
  r.push_back(int_key("bench.batch", kBatchBound, "1", "sequences per batch (B)", FIELD(bench.batch)));
  r.push_back(int_key("bench.seq_len", kSequenceBound, "min(positions.max_len, 128)", "rows per sequence (T)",
                      FIELD(bench.seq_len)));
  r.push_back(int_key("bench.warmup", upto(kNonNegative, limits::kRepeats, kWhyCount), "2",
                      "untimed runs before timing", FIELD(bench.warmup)));
  r.push_back(int_key("bench.reps", upto(kAtLeastOne, limits::kRepeats, kWhyCount), "10", "timed runs",
                      FIELD(bench.reps)));
  append_train_keys(r);
  return r;
}

// train.*: `tessera train` (docs/TRAINING.md).
void append_train_keys(std::vector<KeyRule>& r) {
  auto unit = [](double v) { return v >= 0 && v < 1; };
  r.push_back(enum_key("train.objective", kObjectiveNames, "auto",
                       "classify (labels of a classifier head), lm (next-token loss of an LM head) or mlm (masked-LM "
                       "loss of a non-causal model's LM head, BERT/ESM style); auto: the head decides (lm for an LM head)",
                       FIELD(train.objective)));
  r.push_back(int_key("train.epochs", upto(kAtLeastOne, limits::kEpochs, kWhyCount), "1",
                      "passes over the training data", FIELD(train.epochs)));
  r.push_back(int_key("train.max_steps", kStepsBound, "0", "optimizer steps in all; 0: epochs decide",
                      FIELD(train.max_steps)));
  r.push_back(float_range_key("train.max_minutes", ">= 0", [](double v) { return v >= 0 && v <= 1e6; }, "0",
                              "wall-clock budget of the whole command in minutes: the first steps and one evaluation "
                              "are timed, then the step count is settled to fit (at most max_steps or epochs) and "
                              "kept by --resume; 0: none",
                              FIELD(train.max_minutes)));
  r.push_back(
      int_key("train.batch_size", kBatchBound, "32", "examples per optimizer step", FIELD(train.batch_size)));
  r.push_back(int_key("train.accumulate", kBatchBound, "1",
                      "micro-batches per step (gradient accumulation): batch_size must divide by it",
                      FIELD(train.accumulate)));
  r.push_back(int_key("train.seq_len", kSequenceBound, "min(positions.max_len, 128)",
                      "lm: rows per training window of the token stream", FIELD(train.seq_len)));
  r.push_back(int_key("train.seed", kNonNegative, "0", "seed of the data order, the validation split and the windows",
                      FIELD(train.seed)));
  r.push_back(enum_key("train.optimizer", kOptimizerNames, "adamw",
                       "adamw (decoupled weight decay) or sgd (momentum, L2 decay)", FIELD(train.optimizer)));
  r.push_back(float_key("train.lr", "0.001", "peak learning rate", FIELD(train.lr)));
  r.push_back(float_range_key("train.beta1", "in [0, 1)", +unit, "0.9", "adamw: first-moment decay", FIELD(train.beta1)));
  r.push_back(float_range_key("train.beta2", "in [0, 1)", +unit, "0.999", "adamw: second-moment decay",
                              FIELD(train.beta2)));
  r.push_back(float_key("train.eps", "1e-08", "adamw: added to the root of the second moment", FIELD(train.eps)));
  r.push_back(float_range_key("train.weight_decay", ">= 0", [](double v) { return v >= 0; }, "0.01",
                              "weight decay of the parameters not in no_decay", FIELD(train.weight_decay)));
  r.push_back(float_range_key("train.momentum", "in [0, 1)", +unit, "0.9", "sgd: momentum", FIELD(train.momentum)));
  r.push_back(bool_key("train.nesterov", "false", "sgd: Nesterov momentum", FIELD(train.nesterov)));
  r.push_back(string_list_key("train.no_decay",
                              "parameter groups without weight decay: norms, biases, embeddings (default all three)",
                              FIELD(train.no_decay)));
  r.push_back(string_list_key("train.freeze",
                              "parameters not trained, by name prefix ending at a dot (stem, pos, blocks, blocks.0, "
                              "head.w): no update, no optimizer state; [stem, pos, blocks] is a linear probe",
                              FIELD(train.freeze)));
  r.push_back(enum_key("train.schedule", kScheduleNames, "cosine",
                       "the learning rate after warmup: cosine or linear decay to min_lr_ratio, or constant",
                       FIELD(train.schedule)));
  r.push_back(int_key("train.warmup_steps", kStepsBound, "0", "steps of linear warmup from 0",
                      FIELD(train.warmup_steps)));
  r.push_back(float_range_key("train.min_lr_ratio", "in [0, 1]", [](double v) { return v >= 0 && v <= 1; }, "0",
                              "the learning rate at the last step, as a share of lr", FIELD(train.min_lr_ratio)));
  r.push_back(float_range_key("train.clip_norm", ">= 0", [](double v) { return v >= 0; }, "1",
                              "global gradient-norm clipping; 0: none", FIELD(train.clip_norm)));
  r.push_back(float_range_key("train.label_smoothing", "in [0, 1)", +unit, "0",
                              "share of each target's probability spread evenly over the classes",
                              FIELD(train.label_smoothing)));
  r.push_back(enum_key("train.precision", kDTypeNames, "f32",
                       "the training matmuls: f32, or bf16 (mixed precision: bf16 inputs, f32 sums, f32 master "
                       "weights; native kernels on AVX512_BF16, emulated elsewhere)",
                       FIELD(train.precision)));
  r.push_back(float_range_key("train.validation", "in [0, 1)", +unit, "0.1",
                              "share of the data held out for validation (seeded), unless validation_data is given",
                              FIELD(train.validation)));
  r.push_back(train_data_key("train.validation_data", &TrainConfig::validation_data,
                             "a dataset of its own for validation; relative to the YAML file"));
  r.push_back(train_data_key("train.test_data", &TrainConfig::test_data,
                             "a test set, evaluated once at the end with the best checkpoint"));
  r.push_back(train_data_key("train.validation_labels", &TrainConfig::validation_labels,
                             "idx: the labels file of validation_data's images (as data.labels is data.path's)", false));
  r.push_back(train_data_key("train.test_labels", &TrainConfig::test_labels,
                             "idx: the labels file of test_data's images (as data.labels is data.path's)", false));
  r.push_back(int_key("train.eval_every", kStepsBound, "0",
                      "steps between evaluations; 0: at the end of each epoch", FIELD(train.eval_every)));
  r.push_back(enum_key("train.metric", kMetricNames, "auto",
                       "what picks the best checkpoint and early stopping: accuracy (classify; mlm: at the masked "
                       "rows), loss (lm, mlm), macro_f1 (classify) or task_mean (the unweighted mean of the "
                       "tasks' accuracies, model.head.tasks); ties keep the earlier",
                       FIELD(train.metric)));
  r.push_back(int_key("train.patience", upto(kNonNegative, limits::kKeep, kWhyCount), "0",
                      "stop after this many evaluations without a better metric; 0: never",
                      FIELD(train.patience)));
  r.push_back(int_key("train.keep", upto(kAtLeastOne, limits::kKeep, kWhyCount), "2",
                      "checkpoints kept (the best is kept as well)", FIELD(train.keep)));
  r.push_back(int_key("train.log_every", upto(kAtLeastOne, limits::kSteps, kWhyCount), "10",
                      "steps between metrics.jsonl lines", FIELD(train.log_every)));
  r.push_back(string_key("train.separator", "\"\\n\"",
                         "lm: written between consecutive items of the token stream (a text file's line breaks); "
                         "\"\": the items run together",
                         FIELD(train.separator)));
  r.push_back(enum_key("train.baseline", kBaselineNames, "none",
                       "lm: train a baseline instead of the model: unigram or bigram (counted on the training "
                       "stream, add-k smoothed), or proximity (the next token from the mean of the last `window` "
                       "token embeddings, width d_model, trained by gradient); mlm: unigram only, scored on the "
                       "masked rows",
                       FIELD(train.baseline)));
  r.push_back(float_range_key("train.add_k", "> 0", [](double v) { return v > 0; }, "1",
                              "unigram, bigram: added to every count (add-k smoothing)", FIELD(train.add_k)));
  r.push_back(int_key("train.window", kSequenceBound, "8",
                      "proximity: how many preceding tokens are averaged", FIELD(train.window)));
  r.push_back(float_range_key("train.mask_prob", "in (0, 1)", [](double v) { return v > 0 && v < 1; }, "0.15",
                              "mlm: share of each example's content rows chosen for the loss (what becomes of them: "
                              "train.mask_replace, train.mask_random)",
                              FIELD(train.mask_prob)));
  r.push_back(float_range_key("train.mask_replace", "in [0, 1]", [](double v) { return v >= 0 && v <= 1; }, "0.8",
                              "mlm: share of the chosen rows replaced by the mask token",
                              FIELD(train.mask_replace)));
  r.push_back(float_range_key("train.mask_random", "in [0, 1]", [](double v) { return v >= 0 && v <= 1; }, "0.1",
                              "mlm: share of the chosen rows replaced by a random ordinary token (the rest, "
                              "1 - mask_replace - mask_random, are left as they are); the two add up to at most 1",
                              FIELD(train.mask_random)));
  r.push_back(
      int_key("train.mask_id", upto({-1, ">= -1"}, limits::kVocab, kWhyVocab), "-1",
              "mlm: the mask token's id; -1: the plugin's ([MASK] of a WordPiece vocabulary, ESM's <mask>)",
              FIELD(train.mask_id)));
  // A section of its own inside train: last, so that train's keys stay in one piece (to_yaml).
  r.push_back(float_range_key("train.dropout.embedding", "in [0, 1)", +unit, "0",
                              "dropout on the stem's output (embeddings and positions summed) while training",
                              FIELD(train.dropout.embedding)));
  r.push_back(float_range_key("train.dropout.attention", "in [0, 1)", +unit, "0",
                              "dropout on the attention weights while training", FIELD(train.dropout.attention)));
  r.push_back(float_range_key("train.dropout.residual", "in [0, 1)", +unit, "0",
                              "dropout on each sub-layer's output (after W_O, after the FFN) before the residual "
                              "add, while training",
                              FIELD(train.dropout.residual)));
}

#undef FIELD

// ---------------------------------------------------------------------------------------------
// Defaults that depend on other keys, and checks across keys.

std::string str(int64_t v) { return std::to_string(v); }
std::string count(int64_t n, const std::string& noun) { return str(n) + " " + noun + (n == 1 ? "" : "s"); }

}  // namespace

// Sizes of a resolved model that no key's bound covers: a Hugging Face folder's (its config.json is
// not read through the keys' rules, so every size is checked again here), and the products of
// several keys: the heads' widths, and the parameter count, added up without overflowing. `origin`
// names where the sizes came from when it is not the YAML ("/m/config.json sets it to ").
// Returns false when a size is refused; the model's parameters are not computed then.
bool check_model_sizes(const ModelConfig& m, WalkContext& c, const Location& at, const std::string& origin) {
  struct Size {
    const char* key;
    int64_t value;
    IntBound bound;
  };
  const Size sizes[] = {
      {"model.d_model", m.d_model, kWidthBound},
      {"model.n_layers", m.n_layers, upto(kAtLeastOne, limits::kLayers, kWhyLayers)},
      {"model.n_heads", m.n_heads, kHeadsBound},
      {"model.d_k", m.d_k, kWidthBound},
      {"model.d_v", m.d_v, kWidthBound},
      {"model.d_ff", m.d_ff, upto(kNonNegative, limits::kHidden, kWhyHidden)},
      {"model.positions.max_len", m.positions.max_len, upto(kPositive, limits::kSequence, kWhySequence)},
      {"model.positions.max_distance", m.positions.max_distance,
       upto(kPositive, limits::kDistance, kWhyTable)},
      {"model.stem.vocab_size", m.stem.vocab_size, upto(kNonNegative, limits::kVocab, kWhyVocab)},
      {"model.stem.n_features", m.stem.n_features, upto(kNonNegative, limits::kHidden, kWhyHidden)},
      {"model.stem.token_types", m.stem.token_types, upto(kNonNegative, limits::kTable, kWhyTable)},
      {"model.stem.modalities", m.stem.modalities, upto(kNonNegative, limits::kTable, kWhyTable)},
      {"model.head.n_classes", m.head.n_classes, upto(kNonNegative, limits::kVocab, kWhyVocab)},
  };
  bool ok = true;
  for (const Size& s : sizes) {
    if (c.is_bad(s.key)) {
      ok = false;
      continue;
    }
    if (s.value >= s.bound.min && s.value <= s.bound.max) continue;
    const std::string v = std::to_string(s.value);
    c.error(at, s.key,
            origin + v +
                (s.value > s.bound.max ? ", more than the limit " + std::to_string(s.bound.max)
                                       : ", but it must be " + std::string(s.bound.text)),
            s.value > s.bound.max && s.bound.why ? s.bound.why : "");
    ok = false;
  }
  if (!ok) return false;
  // Each head's queries, keys and values side by side: (T, n_heads * d_k) and (T, n_heads * d_v).
  for (const auto& [key, d] : {std::pair{"model.d_k", m.d_k}, std::pair{"model.d_v", m.d_v}}) {
    if (m.n_heads * d <= limits::kHidden) continue;  // both at most 2^16: no overflow
    c.error(c.exp->locations.count(key) ? c.where(key) : at, key,
            "n_heads * " + std::string(key + 6) + " is " + std::to_string(m.n_heads * d) +
                ", more than the limit " + std::to_string(limits::kHidden) + " for the heads side by side",
            "fewer heads, or narrower ones");
    ok = false;
  }
  if (!ok) return false;
  int64_t total = 0;
  for (const ParamSpec& p : parameter_specs(m)) {
    int64_t n = 1;
    bool over = false;
    for (int64_t d : p.shape) over = over || __builtin_mul_overflow(n, d, &n);
    if (over || __builtin_add_overflow(total, n, &total) || total > limits::kParameters) {
      c.error(c.exp->locations.count("model") ? c.where("model") : at, "model",
              "the model has more than " + std::to_string(limits::kParameters) +
                  " parameters (2^42, the limit; " + p.name + " " + p.shape.str() + " alone has " +
                  (over ? "more than 2^63" : std::to_string(n)) + ")",
              "make it smaller: d_model, d_ff, n_layers or the vocabulary");
      return false;
    }
  }
  return true;
}

namespace {

// model.from: hf: the folder gives the model (the resolve layer imports it before resolve() runs);
// model.path must be given, and only name, dtype, init and head keys may be written beside it.
void check_hf_keys(WalkContext& c) {
  if (!c.is_given("model.path")) {
    if (!c.is_bad("model.path"))
      c.error(c.where("model.from"), "model.path", "required key is missing (model.from is hf)",
              "add `path: <folder>` under `model:`");
    return;
  }
  const std::string folder_json = c.exp->model.path + "/config.json";
  for (const std::string& k : c.given) {
    if (k.rfind("model.", 0) != 0 || k == "model.from" || k == "model.path" || k == "model.name" ||
        k == "model.dtype" || k.rfind("model.head.", 0) == 0 || k.rfind("model.init.", 0) == 0 ||
        k == "model.include")
      continue;
    c.error(c.where(k), k, "is set by " + folder_json + " (model.from is hf)",
            "remove it; beside from: hf only name, dtype, init and head keys may be set");
  }
}

void resolve_model(WalkContext& c) {
  ModelConfig& m = c.exp->model;
  if (m.source == ModelSource::hf) {
    check_hf_keys(c);
    return;
  }
  if (c.is_given("model.path"))
    c.error(c.where("model.path"), "model.path", "applies only with model.from: hf", "add `from: hf` under `model:`");
  auto missing = [&](const std::string& key, const std::string& why, const std::string& hint) {
    if (c.is_bad("model.include")) return;  // the keys may well be in the file that failed
    c.error(c.where(key), key, "required key is missing" + why, hint);
  };
  const bool have_d_model = c.is_given("model.d_model");
  if (!have_d_model && !c.is_bad("model.d_model")) {
    missing("model.d_model", "", "add `d_model: <int>` under `model:`");
  }

  if (!c.is_given("model.causal")) m.causal = m.arch == Arch::decoder;

  // Head widths.
  bool dims_ok = have_d_model && !c.is_bad("model.n_heads");
  const bool need_dk = !c.is_given("model.d_k") && !c.is_bad("model.d_k");
  const bool need_dv = !c.is_given("model.d_v") && !c.is_bad("model.d_v");
  if (dims_ok && (need_dk || need_dv) && m.d_model % m.n_heads != 0) {
    c.error(c.where("model.n_heads"), "model.n_heads",
            "n_heads (" + str(m.n_heads) + ") does not divide d_model (" + str(m.d_model) + ")",
            "choose n_heads dividing d_model, or set d_k and d_v explicitly");
    dims_ok = false;
  }
  if (dims_ok) {
    if (need_dk) m.d_k = m.d_model / m.n_heads;
    if (need_dv) m.d_v = m.d_model / m.n_heads;
  }
  const bool dk_ok = m.d_k > 0 && !c.is_bad("model.d_k");
  const bool dv_ok = dims_ok && m.d_v > 0 && !c.is_bad("model.d_v");
  if (have_d_model && !c.is_given("model.d_ff") && !c.is_bad("model.d_ff")) m.d_ff = 4 * m.d_model;

  if (!c.is_given("model.final_norm")) {
    m.final_norm = m.norm == NormPlacement::pre;
  } else if (m.final_norm && m.norm == NormPlacement::none && !c.is_bad("model.norm")) {
    c.error(c.where("model.final_norm"), "model.final_norm", "final_norm: true needs a norm, but norm is none",
            "set norm: pre or post, or final_norm: false");
  }

  // A pre-LN block is defined by its residual stream (R = X + MultiHead(LN1(X))): without the
  // residuals it would be a different model, and the blocks always add them.
  if (m.norm == NormPlacement::pre && !m.residual && c.is_given("model.residual") && !c.is_bad("model.norm") &&
      !c.is_bad("model.residual")) {
    c.error(c.where("model.residual"), "model.residual",
            "residual: false with norm: pre, but a pre-LN block is built around its residual stream "
            "(R = X + MultiHead(LN1(X)), Y = R + FFN(LN2(R))) and always adds it",
            "keep residual: true with norm: pre, or use norm: post or none for blocks without residuals");
  }

  if (m.attention.scale == 0.0 && dk_ok) m.attention.scale = 1.0 / std::sqrt(static_cast<double>(m.d_k));

  if (!m.attention.output_projection && dv_ok && !c.is_bad("model.n_layers") && !c.is_bad("model.residual") &&
      !c.is_bad("model.head.kind")) {
    const bool heads_fill = m.n_heads * m.d_v == m.d_model;
    const bool bare = m.n_layers == 1 && m.head.kind == HeadKind::none && !m.residual;
    if (!heads_fill && !bare) {
      c.error(c.where("model.attention.output_projection"), "model.attention.output_projection",
              "output_projection: false leaves the heads " + str(m.n_heads * m.d_v) +
                  " wide (n_heads * d_v), but d_model is " + str(m.d_model),
              "keep output_projection: true, or make n_heads * d_v = d_model; only a single layer "
              "with residual: false and head.kind: none may end at another width");
    }
  }

  // Positions.
  PositionConfig& p = m.positions;
  if (!c.is_given("model.positions.rotary_dims") && dk_ok) p.rotary_dims = m.d_k;
  if (p.kind == PositionKind::rotary && dk_ok) {
    if (m.d_k % 2 != 0) {
      c.error(c.where("model.positions.kind"), "model.positions.kind",
              "rotary positions need an even d_k, but d_k is " + str(m.d_k),
              "choose n_heads so that d_model / n_heads is even, or set an even d_k");
    } else if (c.is_given("model.positions.rotary_dims") && (p.rotary_dims % 2 != 0 || p.rotary_dims > m.d_k)) {
      c.error(c.where("model.positions.rotary_dims"), "model.positions.rotary_dims",
              "rotary_dims (" + str(p.rotary_dims) + ") must be even and at most d_k (" + str(m.d_k) + ")");
    }
  }

  // Stem.
  StemConfig& s = m.stem;
  if (!c.is_bad("model.stem.kind")) {
    const bool tokens = s.kind == StemKind::tokens || s.kind == StemKind::mixed;
    const bool features = s.kind == StemKind::features || s.kind == StemKind::mixed;
    const std::string why = std::string(" (stem.kind is ") + stem_kind_name(s.kind) + ")";
    if (tokens && !c.is_given("model.stem.vocab_size") && !c.is_bad("model.stem.vocab_size")) {
      missing("model.stem.vocab_size", why, "add `vocab_size: <int>` under `model.stem:`");
    }
    if (features && !c.is_given("model.stem.n_features") && !c.is_bad("model.stem.n_features")) {
      missing("model.stem.n_features", why, "add `n_features: <int>` under `model.stem:`");
    }
    if (s.cls && !features) {
      c.error(c.where("model.stem.cls"), "model.stem.cls",
              std::string("cls: true needs stem.kind features or mixed, but stem.kind is ") + stem_kind_name(s.kind),
              "set cls: false, or stem.kind: features");
    }
  }

  // Head.
  HeadConfig& h = m.head;
  if (!c.is_given("model.head.pool")) {
    h.pool = s.cls ? PoolKind::cls : PoolKind::mean;
  } else if (h.pool == PoolKind::cls && !s.cls && !c.is_bad("model.stem.cls")) {
    c.error(c.where("model.head.pool"), "model.head.pool", "pool: cls needs stem.cls: true",
            "set pool: mean or last, or stem.cls: true");
  }
  if (!h.tasks.empty()) {
    // The tasks' blocks of classes, one after another; a label names one class of one task.
    const std::string key = "model.head.tasks";
    std::map<std::string, std::string> owner;  // label -> the task that has it
    std::set<std::string> names;
    int64_t first = 0;
    bool ok = true;
    for (size_t i = 0; i < h.tasks.size(); ++i) {
      HeadTask& t = h.tasks[i];
      const std::string at = key + "[" + std::to_string(i) + "]";
      const bool plain = !t.name.empty() && std::all_of(t.name.begin(), t.name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
      });
      if (!plain) {
        c.error(t.where, at + ".name", "task name \"" + t.name + "\" is not a plain name (letters, digits, _ and -)",
                "it names the task's figures and its confusion_<name>.png");
        ok = false;
      } else if (!names.insert(t.name).second) {
        c.error(t.where, at + ".name", "a second task named \"" + t.name + "\"", "give each task its own name");
        ok = false;
      }
      for (const std::string& l : t.labels) {
        auto [it, fresh] = owner.emplace(l, t.name);
        if (!fresh) {
          c.error(t.where, at + ".labels",
                  "label \"" + l + "\" is in two tasks (" + (it->second == t.name ? "twice in task " + t.name
                                                                                  : it->second + " and " + t.name) + ")",
                  "a label names one class of one task: rename one of them (e.g. \"" + t.name + ":" + l + "\")");
          ok = false;
        }
      }
      t.first = first;
      first += static_cast<int64_t>(t.labels.size());
    }
    if (h.kind != HeadKind::classifier && !c.is_bad("model.head.kind")) {
      c.error(c.where(key), key, std::string("tasks group the classes of a classifier head, but head.kind is ") +
                                     head_kind_name(h.kind),
              "set head.kind: classifier, or remove tasks");
      ok = false;
    } else if (c.is_given("model.head.labels") && !c.is_bad("model.head.labels")) {
      // As a resolved config prints them: the tasks' labels in order (so that it loads again).
      std::vector<std::string> all;
      for (const HeadTask& t : h.tasks) all.insert(all.end(), t.labels.begin(), t.labels.end());
      if (h.labels != all) {
        c.error(c.where("model.head.labels"), "model.head.labels",
                "labels and tasks both name the classes, and differ: the head's labels are the tasks' labels in order",
                "remove model.head.labels");
        ok = false;
      }
    }
    if (ok && c.is_given("model.head.n_classes") && h.n_classes != first) {
      c.error(c.where("model.head.n_classes"), "model.head.n_classes",
              "n_classes " + str(h.n_classes) + ", but the tasks have " + count(first, "label") + " in all",
              "remove n_classes (the tasks give it) or make it " + str(first));
      ok = false;
    }
    if (ok) {
      h.labels.clear();
      for (const HeadTask& t : h.tasks) h.labels.insert(h.labels.end(), t.labels.begin(), t.labels.end());
      h.n_classes = first;
    }
  }
  if (h.kind == HeadKind::classifier && h.tasks.empty() && !c.is_given("model.head.n_classes") &&
      !c.is_bad("model.head.n_classes")) {
    missing("model.head.n_classes", " (head.kind is classifier)", "add `n_classes: <int>` under `model.head:`");
  }
  if (!h.labels.empty() && h.tasks.empty() && !c.is_bad("model.head.kind")) {
    if (c.is_given("model.head.n_classes") && static_cast<int64_t>(h.labels.size()) != h.n_classes) {
      c.error(c.where("model.head.labels"), "model.head.labels",
              count(static_cast<int64_t>(h.labels.size()), "label") + " for n_classes " + str(h.n_classes),
              "give one label per class, or none");
    } else if (h.kind != HeadKind::classifier) {
      c.error(c.where("model.head.labels"), "model.head.labels",
              std::string("labels name the classes of a classifier head, but head.kind is ") + head_kind_name(h.kind),
              "set head.kind: classifier and n_classes, or remove labels");
    }
  }
  if (h.kind == HeadKind::lm && h.tied && s.kind != StemKind::tokens && s.kind != StemKind::mixed &&
      !c.is_bad("model.stem.kind")) {
    c.error(c.where("model.head.tied"), "model.head.tied",
            std::string("tied: true needs stem.kind tokens or mixed (the logits reuse the token embedding table), "
                        "but stem.kind is ") + stem_kind_name(s.kind),
            "set head.tied: false");
  }

  // Keys of particular families (BERT, AST, ESM-2): each needs the part it belongs to.
  auto needs = [&](bool set, bool fine, const char* key, const std::string& why) {
    if (set && !fine) c.error(c.where(key), key, why);
  };
  const bool tokens = s.kind == StemKind::tokens || s.kind == StemKind::mixed;
  const bool pooled = h.kind == HeadKind::pool || h.kind == HeadKind::classifier;
  needs(s.token_types > 0, tokens, "model.stem.token_types", "token types need stem.kind tokens or mixed");
  needs(s.dist, s.cls, "model.stem.dist", "dist: true needs stem.cls: true (the distillation row follows the CLS row)");
  needs(s.token_dropout, tokens && s.mask_id >= 0 && (s.vocab_size == 0 || s.mask_id < s.vocab_size),
        "model.stem.token_dropout", "token_dropout needs a token stem and stem.mask_id within the vocabulary");
  needs(h.pooler, pooled, "model.head.pooler", "pooler: true needs head.kind pool or classifier");
  needs(h.norm, h.kind == HeadKind::classifier, "model.head.norm", "head.norm: true needs head.kind classifier");
  needs(h.transform, h.kind == HeadKind::lm, "model.head.transform", "transform: true needs head.kind lm");
  needs(h.lm_bias, h.kind == HeadKind::lm && h.tied, "model.head.lm_bias",
        "lm_bias: true needs a tied lm head (an untied one has its bias when model.bias)");
  needs(h.pool == PoolKind::cls_dist, s.dist, "model.head.pool", "pool: cls_dist needs stem.dist: true");

  // Weights.
  if (!c.is_given("model.weights.allow_missing")) {
    m.weights.allow_missing = !c.is_given("model.weights.file") && !c.is_bad("model.weights.file");
  }
  if (c.is_given("model.weights.ignore")) m.weights.ignore_where = c.where("model.weights.ignore");

  // Products of sizes, once every size of the model is known and fine.
  const bool model_bad = std::any_of(c.bad.begin(), c.bad.end(), [](const std::string& k) {
    return k == "model" || k.rfind("model.", 0) == 0;
  });
  if (!model_bad) check_model_sizes(m, c, c.where("model"), "");
}

// data.labels and data.label_names belong to IDX datasets (the runner detects the format of
// data.format auto from the file name).
void resolve_data(WalkContext& c) {
  const DataConfig& d = c.exp->data;
  const bool idx = d.format == DataFormat::idx || d.format == DataFormat::auto_detect;
  if (!d.labels.empty() && !idx && !c.is_bad("data.format"))
    c.error(c.where("data.labels"), "data.labels",
            std::string("a labels file belongs to an IDX dataset, but data.format is ") +
                data_format_name(d.format),
            "manifests give each item's label in a label column");
  if (!d.label_names.empty() && d.labels.empty() && !c.is_bad("data.labels"))
    c.error(c.where("data.label_names"), "data.label_names", "names for the labels, but no data.labels file",
            "give data.labels, the idx1 file of the images' labels");
  // An IDX dataset's validation and test sets need their own labels files, and only they do.
  const TrainConfig& t = c.exp->train;
  for (const auto& [set, labels, set_key, labels_key] :
       {std::tuple{&t.validation_data, &t.validation_labels, "train.validation_data", "train.validation_labels"},
        std::tuple{&t.test_data, &t.test_labels, "train.test_data", "train.test_labels"}}) {
    if (c.is_bad(set_key) || c.is_bad(labels_key) || c.is_bad("data.labels")) continue;
    if (!labels->empty() && d.labels.empty())
      c.error(c.where(labels_key), labels_key, "a labels file, but data.labels is not given",
              "labels files belong to IDX datasets, whose images' labels data.labels names");
    else if (!labels->empty() && set->empty())
      c.error(c.where(labels_key), labels_key, std::string("a labels file, but no ") + set_key,
              std::string("give ") + set_key + ", the idx3 file of the images these label");
    else if (labels->empty() && !set->empty() && !d.labels.empty())
      c.error(c.where(set_key), set_key, "an IDX set without its labels",
              std::string("give ") + labels_key + ", the idx1 file of its images' labels");
  }
}

void resolve_input(WalkContext& c) {
  InputConfig& in = c.exp->input;
  const ModelConfig& m = c.exp->model;
  in.where = c.where("input");
  const bool rows = in.rows.defined();
  const bool ids = !in.ids.empty();
  if (rows && ids) {
    c.error(c.where("input.ids"), "input.ids", "input.rows and input.ids are both given",
            "give input.ids for stem.kind tokens, input.rows for stem.kind features or identity");
  }
  if (!c.is_bad("model.stem.kind")) {
    if ((rows || ids) && m.stem.kind == StemKind::mixed) {
      c.error(c.where(rows ? "input.rows" : "input.ids"), rows ? "input.rows" : "input.ids",
              "stem.kind mixed reads its rows from plugins; inline input is for one kind of row",
              "run the experiment with `tessera run` over a dataset");
    }
    if (rows && m.stem.kind == StemKind::tokens) {
      c.error(c.where("input.rows"), "input.rows", "stem.kind tokens takes input.ids, not input.rows",
              "give token ids, or set stem.kind: features or identity");
    }
    if (ids && m.stem.kind != StemKind::tokens && m.stem.kind != StemKind::mixed) {
      c.error(c.where("input.ids"), "input.ids",
              std::string("stem.kind ") + stem_kind_name(m.stem.kind) + " takes input.rows, not input.ids",
              "give feature rows, or set stem.kind: tokens");
    }
  }
  if (!in.tokens.empty() && (rows || ids)) {
    const int64_t n = rows ? in.rows.dim(0) : static_cast<int64_t>(in.ids.size());
    if (static_cast<int64_t>(in.tokens.size()) != n) {
      c.error(c.where("input.tokens"), "input.tokens",
              count(static_cast<int64_t>(in.tokens.size()), "token") + " for " + count(n, rows ? "row" : "id"),
              "give one token label per input row");
    }
  }
  if (ids && m.stem.kind == StemKind::tokens && c.is_given("model.stem.vocab_size")) {
    const Node& list = *c.values.at("input.ids");
    for (size_t i = 0; i < in.ids.size(); ++i) {
      if (in.ids[i] >= m.stem.vocab_size) {
        c.error(*list.items[i], "input.ids",
                "entry " + std::to_string(i) + ": id " + str(in.ids[i]) + " is outside the vocabulary (stem.vocab_size is " +
                    str(m.stem.vocab_size) + ")",
                "ids must be in [0, vocab_size)");
      }
    }
  }
  if (rows && !c.is_bad("model.stem.kind")) {
    const int64_t width = in.rows.dim(1);
    if (m.stem.kind == StemKind::features && c.is_given("model.stem.n_features") && width != m.stem.n_features) {
      c.error(c.where("input.rows"), "input.rows",
              "rows are " + str(width) + " wide, but stem.n_features is " + str(m.stem.n_features));
    }
    if (m.stem.kind == StemKind::identity && c.is_given("model.d_model") && width != m.d_model) {
      c.error(c.where("input.rows"), "input.rows",
              "rows are " + str(width) + " wide, but d_model is " + str(m.d_model) +
                  " (stem.kind identity passes rows through unchanged)");
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

bool read_plugin_options(const PluginRequest& q, const std::vector<PluginOptionSpec>& specs, WalkContext& c,
                         PluginConfig* pc) {
  bool ok = true;
  const std::string& at = q.at;
  std::map<std::string, std::string> given;
  std::vector<std::string> known;
  for (const PluginOptionSpec& o : specs) known.push_back(o.name);
  const Node* options = q.options;
  for (size_t e = 0; options && options->is_map() && e < options->entries.size(); ++e) {
    const MapEntry& entry = options->entries[e];
    const std::string okey = at + ".options." + entry.key;
    auto spec = std::find_if(specs.begin(), specs.end(),
                             [&](const PluginOptionSpec& o) { return o.name == entry.key; });
    if (spec == specs.end()) {
      const std::string near = nearest(entry.key, known);
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      c.error(entry.key_pos.location(), okey, "unknown option of plugin " + pc->name,
              near.empty() ? "its options: " + list : "did you mean `" + near + "`?");
      ok = false;
      continue;
    }
    std::string value;
    if (!read_plugin_option(*entry.value, okey, c, *spec, &value)) {
      ok = false;
      continue;
    }
    given[entry.key] = value;
    pc->option_where[entry.key] = entry.key_pos.location();
    c.exp->locations[okey] = entry.key_pos.location();
  }
  for (const PluginOptionSpec& o : specs) {
    auto g = given.find(o.name);
    if (g != given.end()) {
      pc->options.emplace_back(o.name, g->second);
      pc->option_types.push_back(o.type);
    } else if (o.default_value) {
      pc->options.emplace_back(o.name, *o.default_value);
      pc->option_types.push_back(o.type);
    } else {
      c.error(options ? *options : *q.item, at + ".options." + o.name,
              "missing option `" + o.name + "` (required by plugin " + pc->name + ": " + o.meaning + ")",
              "add `" + o.name + ": <" + option_type_name(o.type) + ">` under options:");
      ok = false;
    }
  }
  return ok;
}

const std::vector<KeyRule>& key_rules() {
  static const std::vector<KeyRule> rules = build_rules();
  return rules;
}

namespace {

// train.freeze: every entry names at least one of the model's parameters, and something is left
// to train. Checked only on a model without problems of its own (its parameters are known then).
void resolve_freeze(WalkContext& c) {
  const TrainConfig& t = c.exp->train;
  if (t.freeze.empty() || c.is_bad("train.freeze")) return;
  for (const std::string& k : c.bad)
    if (k == "model" || k.rfind("model.", 0) == 0) return;
  const std::vector<ParamSpec> specs = parameter_specs(c.exp->model);
  auto it = c.values.find("train.freeze");
  auto at = [&](size_t i) {
    if (it != c.values.end() && it->second && i < it->second->items.size()) return it->second->items[i]->pos.location();
    return c.where("train.freeze");
  };
  std::string parts;  // the model's top-level names, for the hint
  for (const ParamSpec& s : specs) {
    const std::string top = s.name.substr(0, s.name.find('.'));
    if ((", " + parts + ",").find(", " + top + ",") == std::string::npos) parts += (parts.empty() ? "" : ", ") + top;
  }
  for (size_t i = 0; i < t.freeze.size(); ++i) {
    const std::string& e = t.freeze[i];
    TrainConfig one;
    one.freeze = {e};
    const bool any = std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return one.frozen(s.name); });
    if (!any)
      c.error(at(i), "train.freeze",
              "entry " + std::to_string(i) + ": \"" + e + "\" names none of the model's parameters",
              "an entry is a parameter name or a prefix of one ending at a dot (the model's parts: " + parts +
                  "; `tessera check` lists every name)");
  }
  if (std::all_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return t.frozen(s.name); }))
    c.error(c.where("train.freeze"), "train.freeze", "every parameter of the model is frozen: nothing is left to train",
            "leave the head (or some other part) out of train.freeze");
}

// train.objective: mlm: a non-causal model with an LM head over token ids, and a mask token
// inside its vocabulary (whether the plugin has one is known only when it is loaded).
void resolve_mlm(WalkContext& c) {
  const ModelConfig& m = c.exp->model;
  const TrainConfig& t = c.exp->train;
  if (m.head.kind != HeadKind::lm)
    c.error(c.where("train.objective"), "train.objective",
            std::string("mlm needs an LM head, but model.head.kind is ") + head_kind_name(m.head.kind),
            "set model.head: {kind: lm} (tied or untied)");
  if (m.causal)
    c.error(c.where("train.objective"), "train.objective",
            "mlm predicts a masked token from both sides, but the model is causal (a decoder sees only the left)",
            "train an encoder (model.arch: encoder, causal: false), or use train.objective: lm for a decoder");
  if (m.stem.kind != StemKind::tokens)
    c.error(c.where("train.objective"), "train.objective",
            std::string("mlm masks token ids, but model.stem.kind is ") + stem_kind_name(m.stem.kind),
            "use stem.kind: tokens with a plugin that gives ids (text, protein)");
  if (t.mask_replace + t.mask_random > 1 + 1e-12) {
    const std::string key = c.exp->locations.count("train.mask_random") ? "train.mask_random" : "train.mask_replace";
    c.error(c.where(key), key,
            "train.mask_replace (" + format_double(t.mask_replace) + ") and train.mask_random (" +
                format_double(t.mask_random) +
                ") add up to more than 1: they are shares of the same chosen rows",
            "lower one of them; the rows that neither replaces are kept as they are");
  }
  if (t.mask_id >= 0 && m.stem.vocab_size > 0 && t.mask_id >= m.stem.vocab_size)
    c.error(c.where("train.mask_id"), "train.mask_id",
            "the mask token's id " + str(t.mask_id) + " is outside model.stem.vocab_size " + str(m.stem.vocab_size),
            "choose an id below the vocabulary size, or -1 for the plugin's mask token");
}

}  // namespace
}  // namespace config

bool WeightsConfig::ignored(const std::string& name) const {
  for (const std::string& e : ignore)
    if (!e.empty() && name.compare(0, e.size(), e) == 0 && (name.size() == e.size() || name[e.size()] == '.'))
      return true;
  return false;
}

bool TrainConfig::frozen(const std::string& name) const {
  for (const std::string& e : freeze)
    if (!e.empty() && name.compare(0, e.size(), e) == 0 && (name.size() == e.size() || name[e.size()] == '.'))
      return true;
  return false;
}

namespace config {

void resolve(WalkContext& c) {
  if (!c.exp->locations.count("model")) {
    c.error(c.root, "model", "required key is missing", "an experiment needs a `model:` mapping");
  } else {
    resolve_model(c);
  }
  resolve_input(c);
  resolve_data(c);
  BenchConfig& b = c.exp->bench;
  if (!c.is_given("bench.seq_len")) b.seq_len = std::min<int64_t>(c.exp->model.positions.max_len, 128);

  TrainConfig& t = c.exp->train;
  const HeadKind head = c.exp->model.head.kind;
  if (t.objective == Objective::auto_detect && head == HeadKind::lm) t.objective = Objective::lm;
  if (t.objective == Objective::auto_detect && head == HeadKind::classifier) t.objective = Objective::classify;
  if (c.is_given("train.objective") && t.objective == Objective::classify && head != HeadKind::classifier)
    c.error(c.where("train.objective"), "train.objective",
            std::string("classify needs a classifier head, but model.head.kind is ") + head_kind_name(head),
            "set model.head.kind: classifier and n_classes, or train.objective: lm with an LM head");
  if (c.is_given("train.objective") && t.objective == Objective::lm && head != HeadKind::lm)
    c.error(c.where("train.objective"), "train.objective",
            std::string("lm needs an LM head, but model.head.kind is ") + head_kind_name(head),
            "set model.head.kind: lm");
  if (t.objective == Objective::mlm) resolve_mlm(c);
  if (!c.is_given("train.seq_len")) t.seq_len = std::min<int64_t>(c.exp->model.positions.max_len, 128);
  if (t.metric == TrainMetric::auto_detect && t.objective != Objective::auto_detect)
    t.metric = t.objective == Objective::classify ? TrainMetric::accuracy : TrainMetric::loss;
  if (t.metric == TrainMetric::macro_f1 && t.objective != Objective::classify)
    c.error(c.where("train.metric"), "train.metric",
            "macro_f1 is a classifier's metric, but the objective is " +
                std::string(t.objective == Objective::mlm ? "mlm" : t.objective == Objective::lm ? "lm" : "not classify"),
            "use train.metric: loss (or accuracy for a masked LM), or train a classifier head");
  if (t.metric == TrainMetric::task_mean && (t.objective != Objective::classify || c.exp->model.head.tasks.empty()))
    c.error(c.where("train.metric"), "train.metric",
            "task_mean is the mean of the tasks' accuracies, but the model has no model.head.tasks",
            "give the classifier head its tasks (model.head.tasks), or use train.metric: accuracy or macro_f1");
  // The steps timed to settle a budget's step count must have learning rates that do not depend
  // on it: warmup steps (and the first after them), or any step of a constant schedule.
  if (t.max_minutes > 0 && t.schedule != ScheduleKind::constant && t.warmup_steps < kBudgetProbeMin)
    c.error(c.where("train.max_minutes"), "train.max_minutes",
            "a budget times the first steps to settle how many fit, but with warmup_steps " + str(t.warmup_steps) +
                " their learning rates would depend on that count",
            "set train.warmup_steps to at least " + str(kBudgetProbeMin) + ", or train.schedule: constant");
  if (t.batch_size % t.accumulate != 0)
    c.error(c.where("train.accumulate"), "train.accumulate",
            "batch_size " + str(t.batch_size) + " does not divide into " + str(t.accumulate) + " micro-batches",
            "choose accumulate so that batch_size / accumulate is a whole number");
  // (A masked LM's resolved config prints the default, which must load again.)
  if (c.is_given("train.separator") &&
      (t.objective == Objective::classify || (t.objective == Objective::mlm && t.separator != "\n")))
    c.error(c.where("train.separator"), "train.separator",
            "only an lm objective joins items into a stream; a classifier or masked LM trains on each item alone",
            "remove train.separator, or train an LM head");
  if (c.is_given("train.baseline") && t.baseline != Baseline::none && t.objective != Objective::lm &&
      !(t.objective == Objective::mlm && t.baseline == Baseline::unigram))
    c.error(c.where("train.baseline"), "train.baseline",
            std::string(name_of(kBaselineNames, t.baseline)) + " is a language-model baseline, but the objective is " +
                (t.objective == Objective::classify ? "classify"
                 : t.objective == Objective::mlm    ? "mlm (a masked LM has the unigram baseline only)"
                                                    : "not lm"),
            "train an LM head (model.head.kind: lm), or remove train.baseline");
  for (const std::string& g : t.no_decay)
    if (g != "norms" && g != "biases" && g != "embeddings")
      c.error(c.where("train.no_decay"), "train.no_decay", "unknown parameter group \"" + g + "\"",
              "the groups are norms, biases and embeddings");
  resolve_freeze(c);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& cand : candidates) {
    const size_t d = edit_distance(word, cand);
    if (d < best_d) {
      best_d = d;
      best = cand;
    }
  }
  // Near enough: two edits, or a third of the longer name.
  const size_t limit = std::max<size_t>(2, std::max(word.size(), best.size()) / 3);
  return best_d <= limit && best_d < std::max(word.size(), best.size()) ? best : "";
}

}  // namespace config

// ---------------------------------------------------------------------------------------------
// The public side of the schema.

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  return config::nearest(word, candidates);
}

const std::vector<KeySpec>& config_schema() {
  static const std::vector<KeySpec> specs = [] {
    std::vector<KeySpec> out;
    for (const config::KeyRule& r : config::key_rules()) out.push_back(r.spec);
    return out;
  }();
  return specs;
}

std::string schema_markdown() {
  auto cell = [](const std::string& s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const KeySpec& k : config_schema()) {
    out += "| `" + k.path + "` | " + cell(k.type) + " | " + cell(k.default_value) + " | " + cell(k.meaning) + " |\n";
  }
  return out;
}

std::string to_yaml(const Experiment& exp) {
  std::string out = "# " + exp.file + ", resolved: every key with its final value\n";
  std::vector<std::string> open;  // the sections of the previous key
  for (const config::KeyRule& r : config::key_rules()) {
    if (!r.print) continue;
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      size_t dot = r.spec.path.find('.', start);
      parts.push_back(r.spec.path.substr(start, dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    const size_t depth = parts.size() - 1;
    size_t same = 0;
    while (same < open.size() && same < depth && open[same] == parts[same]) ++same;
    for (size_t i = same; i < depth; ++i) out += std::string(2 * i, ' ') + parts[i] + ":\n";
    open.assign(parts.begin(), parts.end() - 1);
    const std::string indent(2 * depth, ' ');
    const std::string value = r.print(exp);
    if (!value.empty() && value[0] == '\n') {
      out += indent + parts.back() + ":";
      for (char ch : value) out += ch == '\n' ? "\n" + indent + "  " : std::string(1, ch);
      out += "\n";
    } else {
      out += indent + parts.back() + ": " + value + "\n";
    }
  }
  return out;
}

const char* arch_name(Arch a) { return config::name_of(config::kArchNames, a); }
const char* norm_name(NormPlacement n) { return config::name_of(config::kNormNames, n); }
const char* position_kind_name(PositionKind p) { return config::name_of(config::kPositionNames, p); }
const char* rotary_style_name(RotaryStyle s) { return config::name_of(config::kRotaryNames, s); }
const char* stem_kind_name(StemKind s) { return config::name_of(config::kStemNames, s); }
const char* embed_scale_name(EmbedScale s) { return config::name_of(config::kEmbedScaleNames, s); }
const char* head_kind_name(HeadKind h) { return config::name_of(config::kHeadNames, h); }
const char* pool_kind_name(PoolKind p) { return config::name_of(config::kPoolNames, p); }
const char* model_source_name(ModelSource s) { return config::name_of(config::kSourceNames, s); }
const char* data_format_name(DataFormat f) { return config::name_of(config::kDataFormatNames, f); }
const char* task_kind_name(TaskKind t) { return config::name_of(config::kTaskNames, t); }
const char* objective_name(Objective o) { return config::name_of(config::kObjectiveNames, o); }
const char* optimizer_kind_name(OptimizerKind k) { return config::name_of(config::kOptimizerNames, k); }
const char* schedule_kind_name(ScheduleKind k) { return config::name_of(config::kScheduleNames, k); }
const char* train_metric_name(TrainMetric m) { return config::name_of(config::kMetricNames, m); }
const char* baseline_name(Baseline b) { return config::name_of(config::kBaselineNames, b); }

}  // namespace tessera
