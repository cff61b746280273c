// Names for status codes, for messages and logs.
#include "tessera/status.h"

namespace tessera {

const char* code_name(Code c) {
  switch (c) {
    case Code::ok: return "ok";
    case Code::invalid_argument: return "invalid argument";
    case Code::not_found: return "not found";
    case Code::io_error: return "I/O error";
    case Code::parse_error: return "parse error";
    case Code::unsupported: return "unsupported";
    case Code::out_of_range: return "out of range";
    case Code::internal: return "internal error";
  }
  return "unknown";
}

}  // namespace tessera
