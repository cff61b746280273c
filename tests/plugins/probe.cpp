// A test plugin written with tessera/plugin.hpp: it encodes text as byte ids (+1, 0 is padding)
// and misbehaves on request, so the host's handling of every failure can be tested:
// option mode=refuse fails create(); items containing FAIL, THROW or MALFORMED fail, throw a
// C++ exception, or return rows the host must reject.
#include <stdexcept>

#include "tessera/plugin.hpp"

namespace {

using tessera::plugin::fail;
using tessera::plugin::Sequence;

class Probe {
 public:
  explicit Probe(const tessera::plugin::Options& o) : offset_(o.get_int("offset")) {
    if (o.get_string("mode") == "refuse") fail(TSR_INVALID_ARGUMENT, "mode refuse: refusing as asked", "mode");
  }
  tsr_encoder_info describe() const {
    tsr_encoder_info i{};
    i.rows_kind = TSR_ROWS_IDS;
    i.vocab_size = 257 + offset_;
    i.causal = 1;
    i.pad_id = 0;
    return i;
  }
  std::vector<Sequence> encode(const tessera::plugin::Item& item) const {
    const std::string_view text = item.text();
    if (text.find("FAIL") != std::string_view::npos)
      fail(TSR_BAD_INPUT, std::string(item.id) + ": the text says FAIL at byte " + std::to_string(text.find("FAIL")));
    if (text.find("THROW") != std::string_view::npos) throw std::runtime_error("thrown from inside the plugin");
    Sequence s;
    s.kind = TSR_ROWS_IDS;
    for (size_t i = 0; i < text.size(); ++i)
      s.add_id(static_cast<uint8_t>(text[i]) + 1 + static_cast<int32_t>(offset_), TSR_ROLE_CONTENT,
               tessera::plugin::byte_span(static_cast<double>(i), static_cast<double>(i + 1)));
    if (text.find("MALFORMED") != std::string_view::npos) s.ids[0] = 100000;  // outside the vocabulary
    std::vector<Sequence> out{s};
    if (text.find("TWICE") != std::string_view::npos) {
      out.push_back(s);
      out[0].label = "w0";
      out[1].label = "w1";
    }
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>(id - 1 - offset_);
    return s;
  }

 private:
  int64_t offset_;
};

const tsr_option_spec kOptions[] = {
    {sizeof(tsr_option_spec), "mode", TSR_OPT_ENUM, "normal", "normal, or refuse to be created", "normal|refuse"},
    {sizeof(tsr_option_spec), "offset", TSR_OPT_INT, "0", "added to every id", nullptr},
};
const tsr_plugin_info kInfo = {sizeof(tsr_plugin_info), "probe", "text", "0.1.0", "byte ids, and failures on request",
                               kOptions, 2, TSR_INPUT_TEXT, ".txt"};

}  // namespace

TESSERA_DEFINE_PLUGIN(Probe, kInfo)
