// Small arithmetic expressions for numbers written in configs ("1/4", "-sqrt(2)/2", "ln(2)"):
// numbers, + - * /, unary minus, parentheses, the constants pi and e, and the functions ln, log
// (both natural), exp and sqrt. Evaluated in double. Not a general calculator: no variables.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera::config {

struct ExprResult {
  bool ok = false;
  double value = 0.0;
  size_t error_offset = 0;  // 0-based offset in the text where the problem is
  std::string error;        // what is wrong, e.g. "expected ')'"
};

ExprResult evaluate_expression(std::string_view text);

}  // namespace tessera::config
