// A recursive-descent evaluator for the expressions of expr.h. Recursion is bounded (kMaxNesting),
// so a string of 100000 '(' is an error, not a stack overflow.
#include "config/expr.h"

#include <charconv>
#include <cmath>
#include <numbers>

namespace tessera::config {
namespace {

constexpr int kMaxNesting = 64;

struct Failure {
  size_t offset;
  std::string what;
};

class Evaluator {
 public:
  explicit Evaluator(std::string_view s) : s_(s) {}

  double run() {
    double v = sum();
    skip_space();
    if (i_ < s_.size()) fail("unexpected '" + std::string(1, s_[i_]) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string what) { throw Failure{i_, std::move(what)}; }
  [[noreturn]] void fail_at(size_t at, std::string what) { throw Failure{at, std::move(what)}; }

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  bool take(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  // sum := product (('+' | '-') product)*
  double sum() {
    double v = product();
    for (;;) {
      if (take('+')) {
        v += product();
      } else if (take('-')) {
        v -= product();
      } else {
        return v;
      }
    }
  }

  // product := unary (('*' | '/') unary)*
  double product() {
    double v = unary();
    for (;;) {
      if (take('*')) {
        v *= unary();
      } else if (take('/')) {
        v /= unary();
      } else {
        return v;
      }
    }
  }

  // unary := ('-' | '+') unary | primary
  double unary() {
    Nest nest(this);
    if (take('-')) return -unary();
    if (take('+')) return unary();
    return primary();
  }

  // primary := number | constant | function '(' sum ')' | '(' sum ')'
  double primary() {
    skip_space();
    if (i_ >= s_.size()) fail("expected a number");
    char c = s_[i_];
    if (c == '(') {
      ++i_;
      double v = sum();
      if (!take(')')) fail("expected ')'");
      return v;
    }
    if ((c >= '0' && c <= '9') || c == '.') return number();
    if (std::isalpha(static_cast<unsigned char>(c))) return named();
    fail("unexpected '" + std::string(1, c) + "'");
  }

  // digits [. digits] [e [+-] digits], or . digits ...
  double number() {
    size_t start = i_;
    auto digits = [&] {
      size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ > from;
    };
    bool whole = digits();
    bool frac = false;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      frac = digits();
    }
    if (!whole && !frac) fail_at(start, "expected a number");
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      size_t mark = i_++;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) i_ = mark;  // "2e" is 2 followed by the name e
    }
    double v = 0.0;
    std::from_chars(s_.data() + start, s_.data() + i_, v);
    return v;
  }

  double named() {
    size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_')) ++i_;
    std::string name(s_.substr(start, i_ - start));
    if (name == "pi") return std::numbers::pi;
    if (name == "e") return std::numbers::e;
    double (*fn)(double) = nullptr;
    if (name == "ln" || name == "log") fn = [](double x) { return std::log(x); };
    if (name == "exp") fn = [](double x) { return std::exp(x); };
    if (name == "sqrt") fn = [](double x) { return std::sqrt(x); };
    if (!fn) fail_at(start, "unknown name '" + name + "' (known: pi, e, ln, log, exp, sqrt)");
    if (!take('(')) fail("expected '(' after " + name);
    double arg = sum();
    if (!take(')')) fail("expected ')'");
    return fn(arg);
  }

  // Counts the depth of unary / parenthesised nesting; every recursion passes through unary().
  struct Nest {
    explicit Nest(Evaluator* e) : e_(e) {
      if (++e_->depth_ > kMaxNesting) e_->fail("nested more than " + std::to_string(kMaxNesting) + " deep");
    }
    ~Nest() { --e_->depth_; }
    Evaluator* e_;
  };

  std::string_view s_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

ExprResult evaluate_expression(std::string_view text) {
  ExprResult r;
  try {
    Evaluator ev(text);
    r.value = ev.run();
  } catch (const Failure& f) {
    r.error_offset = f.offset;
    r.error = f.what;
    return r;
  }
  if (!std::isfinite(r.value)) {
    r.error = "the value is not finite";
    return r;
  }
  r.ok = true;
  return r;
}

}  // namespace tessera::config
