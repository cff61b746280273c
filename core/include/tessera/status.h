// Status and Result<T>: how Tessera reports failures that come from its inputs.
// Expected failures (a bad file, a wrong key, a shape that does not fit) come back as values;
// broken invariants inside the library assert loudly instead. No exception crosses this API.
//
//   tessera::Result<Tensor> r = load_something(path);
//   if (!r.ok()) { fprintf(stderr, "%s\n", r.status().message().c_str()); return 1; }
//   Tensor t = std::move(r).value();
//
// Messages speak to the user: what failed, where (file, line:col, byte offset, tensor or key),
// and a hint for what to do next. Status is a small value type and is cheap to copy when ok.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace tessera {

// Only grows; a removed code stays as a comment so numbers are never reused.
enum class Code : int {
  ok = 0,
  invalid_argument = 1,  // the caller or its input asked for something inconsistent
  not_found = 2,         // a file, key, tensor or plugin that is not there
  io_error = 3,          // the operating system refused a read or write
  parse_error = 4,       // a file's syntax is wrong (YAML, JSON, safetensors header)
  unsupported = 5,       // valid, but this build or this CPU cannot do it
  out_of_range = 6,      // an index, size or offset outside its bounds
  internal = 7,          // a library we call failed in a way we did not foresee
};

const char* code_name(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status Invalid(std::string m) { return {Code::invalid_argument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::not_found, std::move(m)}; }
  static Status IoError(std::string m) { return {Code::io_error, std::move(m)}; }
  static Status ParseError(std::string m) { return {Code::parse_error, std::move(m)}; }
  static Status Unsupported(std::string m) { return {Code::unsupported, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {Code::out_of_range, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::internal, std::move(m)}; }

  bool ok() const { return code_ == Code::ok; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "<prefix>: <message>", keeping the code. Used to add the file or the layer that failed.
  Status with_prefix(const std::string& prefix) const {
    return ok() ? *this : Status(code_, prefix + ": " + message_);
  }

 private:
  Code code_ = Code::ok;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                   // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) {              // NOLINT: implicit on purpose
    if (std::get<Status>(v_).ok()) {
      std::fprintf(stderr, "tessera: internal error: Result built from an ok Status\n");
      std::abort();
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  void check() const {
    if (!ok()) {
      std::fprintf(stderr, "tessera: internal error: value() of a failed Result: %s\n",
                   std::get<Status>(v_).message().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

}  // namespace tessera

#define TSR_CONCAT_INNER_(a, b) a##b
#define TSR_CONCAT_(a, b) TSR_CONCAT_INNER_(a, b)

// Return the Status from the enclosing function if `expr` failed.
#define TSR_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::tessera::Status tsr_st_ = (expr);        \
    if (!tsr_st_.ok()) return tsr_st_;         \
  } while (0)

// `lhs = value of expr`, or return its Status.
#define TSR_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto TSR_CONCAT_(tsr_r_, __LINE__) = (expr);                            \
  if (!TSR_CONCAT_(tsr_r_, __LINE__).ok())                                \
    return TSR_CONCAT_(tsr_r_, __LINE__).status();                        \
  lhs = std::move(TSR_CONCAT_(tsr_r_, __LINE__)).value()

// A broken invariant inside the library (never an input error): print and abort.
#define TSR_CHECK(cond, msg)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "tessera: internal check failed at %s:%d: %s (%s)\n", __FILE__, \
                   __LINE__, #cond, msg);                                                 \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
