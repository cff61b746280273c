// The host side of modality plugins: finding and loading them (dlopen), checking their ABI, and
// running their encoders — one input item in, token rows out, copied into memory the host owns.
//
//   Result<std::string> file = find_plugin("image", {});                 // libtessera_image.so
//   Result<std::shared_ptr<const Plugin>> lib = Plugin::load(*file);     // refuses a wrong ABI
//   Result<Encoder> enc = Encoder::create(*lib, {{"image_size", "224"}, ...});   // all options, as text
//   Result<std::vector<TokenRows>> rows = enc->encode(PluginItem{"cat.jpg", "data/cat.jpg", bytes});
//
// Search order for a plugin named N (file libtessera_N.so): a path given in the YAML, then each
// directory of TESSERA_PLUGIN_PATH (colon-separated), then the build tree's plugins/ folder, then
// the install prefix's lib/tessera/plugins. Every refusal names the file and the reason.
// Ownership: a Plugin stays loaded while any Plugin or Encoder handle refers to it. Threads: a
// Plugin may be shared; an Encoder is used by one thread at a time (make one per worker).
// Isolation: enc->isolate(limits) moves encode() into a worker process, so a plugin that crashes,
// hangs or throws on a hostile item costs that item only (see ItemLimits).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/plugin.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

struct PluginOptionSpec {
  std::string name;
  tsr_option_type type = TSR_OPT_STRING;
  std::optional<std::string> default_value;  // none: required
  std::string meaning;
  std::vector<std::string> choices;          // enums
};
const char* option_type_name(tsr_option_type t);  // "int", "float list", ...

// A loaded plugin library.
class Plugin {
 public:
  static Result<std::shared_ptr<const Plugin>> load(const std::string& file);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const std::string& file() const { return file_; }
  const std::string& name() const { return name_; }
  const std::string& modality() const { return modality_; }
  const std::string& version() const { return version_; }
  const std::string& description() const { return description_; }
  tsr_input_kind input_kind() const { return input_kind_; }
  const std::vector<std::string>& extensions() const { return extensions_; }  // ".png", ...; empty: any
  const std::vector<PluginOptionSpec>& options() const { return options_; }
  const tsr_plugin* table() const { return table_; }

 private:
  Plugin() = default;
  void* handle_ = nullptr;
  const tsr_plugin* table_ = nullptr;
  std::string file_, name_, modality_, version_, description_;
  tsr_input_kind input_kind_ = TSR_INPUT_FILE;
  std::vector<std::string> extensions_;
  std::vector<PluginOptionSpec> options_;
};

// TESSERA_PLUGIN_PATH's directories, then the build tree's and the install prefix's.
std::vector<std::string> plugin_search_dirs();
// The file of plugin `name`: found in `dirs` first, then in plugin_search_dirs().
Result<std::string> find_plugin(const std::string& name, const std::vector<std::string>& dirs);

// Every libtessera_*.so in the directories: what loads, and what was refused and why.
struct PluginScan {
  struct Found {
    std::string name, modality, version, file;
  };
  struct Refused {
    std::string file, reason;
  };
  std::vector<Found> found;
  std::vector<Refused> refused;
};
PluginScan scan_plugins(const std::vector<std::string>& dirs);

// A picture of the item for attention heatmaps (see tsr_picture).
struct Picture {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
};

// One sequence of token rows, owned by the host.
struct TokenRows {
  tsr_rows_kind kind = TSR_ROWS_IDS;
  std::vector<int32_t> ids;                      // (T) ids
  Tensor features;                               // (T, F) f32 feature rows
  std::vector<std::array<int32_t, 2>> positions; // (index, -1) or (grid row, grid col)
  std::vector<uint8_t> roles;                    // tsr_role per row
  std::vector<tsr_provenance> provenance;        // per row
  int grid_rows = 0, grid_cols = 0;
  Picture picture;
  std::string label;                             // "" or a window's suffix ("w0")
  int64_t size() const { return static_cast<int64_t>(roles.size()); }
};

// An item handed to a plugin.
struct PluginItem {
  std::string id;
  std::string source;     // file, or "" for inline text
  std::string_view data;  // valid during encode()
  uint64_t source_offset = 0;
  uint32_t source_line = 0;
};

// Per-item limits on what one item may cost (runtime.* options; the defaults are the runner's).
// The size limits hold in-process too; the time and memory limits need isolate().
struct ItemLimits {
  int64_t max_item_bytes = int64_t{1} << 30;   // runtime.max_item_bytes: bytes of input one item may have
  int64_t max_item_rows = int64_t{1} << 23;    // runtime.max_item_rows: rows of all its sequences together
  double item_timeout_s = 120;                 // runtime.item_timeout_s: seconds in a worker (0: no limit)
  int64_t worker_memory_mb = 8192;             // runtime.worker_memory_mb: address space a worker may add (0: no limit)
};

class Encoder {
 public:
  // `options`: every option of the plugin by name, canonical text (the config loader fills in
  // defaults and validates types). A failure names the plugin and, when the plugin says so, the
  // option at fault (Status message "option <name>: ...").
  static Result<Encoder> create(std::shared_ptr<const Plugin> plugin,
                                const std::vector<std::pair<std::string, std::string>>& options);

  const Plugin& plugin() const;
  const tsr_encoder_info& info() const;
  // The item's sequences (usually one). Bad items come back as a status naming the item; the
  // plugin's rows are checked (kinds, widths, id range, finite values) before they are accepted.
  Result<std::vector<TokenRows>> encode(const PluginItem& item) const;
  Result<std::string> decode(const std::vector<int32_t>& ids) const;
  // Training augmentation: whether the plugin transforms rows under these options, and one
  // seeded transform of `rows` (feature rows this encoder produced) into `features`, rows.size()
  // × width values. Deterministic in (rows, seed); non-finite output is refused.
  bool augments() const;
  // The vocabulary's mask token (masked-LM training), or -1 when the plugin names none (an older
  // plugin, feature rows, a vocabulary without [MASK]).
  int32_t mask_id() const;
  Status augment(const TokenRows& rows, uint64_t seed, float* features) const;

  // Limits on every item this encoder (and its copies) encodes from now on; a new encoder has the
  // defaults above. Checked before the plugin is called (bytes) and before its rows are copied
  // (rows); a refusal names the item, the size and the option. An exception a plugin lets out of
  // encode() is caught in any case and makes the item bad.
  void limit(const ItemLimits& limits);
  // From now on encode() runs in a worker process (see core/src/plugins/workers.h) under `limits`:
  // a worker that dies (a signal, abort()) or runs past item_timeout_s makes that one item bad,
  // with the signal or the limit as its reason, and is replaced for the next item. Call it before
  // the process starts threads (the runner: before the model is built). Copies of this encoder
  // share its worker (one thread at a time, as ever). decode() and augment() stay in this
  // process. Fails only when fork() does.
  Status isolate(const ItemLimits& limits);
  bool isolated() const;
  const ItemLimits& limits() const;
  // The worker's process id (0: none running, or not isolated), and how many were started: for tests.
  int64_t worker_pid() const;
  int64_t workers_started() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessera
