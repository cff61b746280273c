// Loading plugins: dlopen, the exact ABI check, reading the plugin's description, searching the
// plugin path, and running encoders with every returned row checked before the host trusts it.
// The plugins themselves live in plugins/; this file sees them only through plugin.h.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>

#include "plugins/workers.h"
#include "tessera/plugins.h"

// The released layout of the ABI, frozen: a change here is an ABI break (bump the version).
static_assert(offsetof(tsr_error, code) == 4 && offsetof(tsr_error, message) == 8 &&
              offsetof(tsr_error, option) == 8 + TSR_MESSAGE_CAPACITY);
static_assert(offsetof(tsr_option_spec, name) == 8 && offsetof(tsr_option_spec, type) == 16 &&
              offsetof(tsr_option_spec, choices) == 40 && sizeof(tsr_option_spec) == 48);
static_assert(offsetof(tsr_plugin_info, options) == 40 && offsetof(tsr_plugin_info, extensions) == 56 &&
              sizeof(tsr_plugin_info) == 64);
static_assert(offsetof(tsr_encoder_info, vocab_size) == 16 && offsetof(tsr_encoder_info, max_rows) == 32 &&
              offsetof(tsr_encoder_info, augments) == 40 && offsetof(tsr_encoder_info, has_mask) == 48 &&
              offsetof(tsr_encoder_info, mask_id) == 52 && sizeof(tsr_encoder_info) == 56);
static_assert(offsetof(tsr_item, data) == 24 && offsetof(tsr_item, source_line) == 48 && sizeof(tsr_item) == 56);
static_assert(sizeof(tsr_provenance) == 40 && offsetof(tsr_provenance, x0) == 8);
static_assert(offsetof(tsr_picture, pixels) == 16 && sizeof(tsr_picture) == 56);
static_assert(offsetof(tsr_rows, ids) == 16 && offsetof(tsr_rows, provenance) == 48 &&
              offsetof(tsr_rows, picture) == 64 && offsetof(tsr_rows, label) == 120 && sizeof(tsr_rows) == 128);
static_assert(offsetof(tsr_plugin, create) == 16 && offsetof(tsr_plugin, decode) == 56 &&
              offsetof(tsr_plugin, augment) == 64 && sizeof(tsr_plugin) == 72);
// The first release of ABI 1 ended its table at `decode` and its encoder info at `max_rows`.
constexpr size_t kFirstTableSize = offsetof(tsr_plugin, augment);

namespace tessera {

namespace fs = std::filesystem;

const char* option_type_name(tsr_option_type t) {
  switch (t) {
    case TSR_OPT_BOOL: return "bool";
    case TSR_OPT_INT: return "int";
    case TSR_OPT_FLOAT: return "float";
    case TSR_OPT_STRING: return "string";
    case TSR_OPT_PATH: return "path";
    case TSR_OPT_ENUM: return "enum";
    case TSR_OPT_FLOAT_LIST: return "float list";
    case TSR_OPT_INT_LIST: return "int list";
  }
  return "?";
}

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t at = s.find(sep, start);
    const std::string part = s.substr(start, at == std::string::npos ? std::string::npos : at - start);
    if (!part.empty()) out.push_back(part);
    if (at == std::string::npos) break;
    start = at + 1;
  }
  return out;
}

std::string str_or(const char* s, const char* fallback = "") { return s ? s : fallback; }

Code code_of(int32_t c) {
  return c >= 1 && c <= 7 ? static_cast<Code>(c) : Code::internal;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Plugin

Result<std::shared_ptr<const Plugin>> Plugin::load(const std::string& file) {
  const std::string hint = " (rebuild the plugin against this Tessera's tessera/plugin.h)";
  if (!fs::is_regular_file(file)) return Status::NotFound(file + ": no such plugin file");
  // RTLD_NODELETE: a plugin's code stays mapped after the last dlclose. The libraries plugins use
  // keep process-wide state (FFTW's planner and twiddle tables, OpenCV's thread pool and TLS)
  // that must not be unmapped while it is still referenced or cleaned up at exit.
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) return Status::Invalid(file + ": cannot load: " + str_or(dlerror(), "dlopen failed"));
  std::shared_ptr<Plugin> p(new Plugin);
  p->handle_ = handle;  // closed by ~Plugin from here on
  p->file_ = file;
  auto entry = reinterpret_cast<tsr_plugin_entry_fn>(dlsym(handle, TSR_PLUGIN_ENTRY_SYMBOL));
  if (!entry)
    return Status::Invalid(file + ": not a Tessera plugin: it does not export " TSR_PLUGIN_ENTRY_SYMBOL);
  const tsr_plugin* t = entry(TSR_PLUGIN_ABI_VERSION);
  if (!t) return Status::Invalid(file + ": " TSR_PLUGIN_ENTRY_SYMBOL " returned no table");
  if (t->abi_version != TSR_PLUGIN_ABI_VERSION)
    return Status::Unsupported(file + ": built for plugin ABI version " + std::to_string(t->abi_version) +
                               ", but this Tessera speaks ABI version " + std::to_string(TSR_PLUGIN_ABI_VERSION) + hint);
  if (t->size < kFirstTableSize)
    return Status::Unsupported(file + ": its function table has " + std::to_string(t->size) + " bytes, fewer than the " +
                               std::to_string(kFirstTableSize) + " of ABI version " +
                               std::to_string(TSR_PLUGIN_ABI_VERSION) + hint);
  const tsr_plugin_info* info = t->info;
  if (!info || info->size < sizeof(tsr_plugin_info))
    return Status::Unsupported(file + ": its tsr_plugin_info is missing or too small" + hint);
  if (!t->create || !t->destroy || !t->describe || !t->encode || !t->release || !t->decode)
    return Status::Invalid(file + ": its function table has empty entries");
  p->table_ = t;
  p->name_ = str_or(info->name);
  p->modality_ = str_or(info->modality);
  p->version_ = str_or(info->version);
  p->description_ = str_or(info->description);
  p->input_kind_ = info->input_kind == TSR_INPUT_TEXT ? TSR_INPUT_TEXT : TSR_INPUT_FILE;
  for (const std::string& e : split(str_or(info->extensions), '|')) p->extensions_.push_back(e);
  if (p->name_.empty() || p->modality_.empty())
    return Status::Invalid(file + ": the plugin does not say its name and modality");
  const std::string expect = "libtessera_" + p->name_ + ".so";
  if (fs::path(file).filename() != expect)
    return Status::Invalid(file + ": the plugin calls itself \"" + p->name_ + "\", so its file must be named " + expect);
  for (uint32_t i = 0; i < info->n_options; ++i) {
    const tsr_option_spec& o = info->options[i];
    if (o.size < sizeof(tsr_option_spec) || !o.name)
      return Status::Invalid(file + ": option " + std::to_string(i) + " is malformed");
    PluginOptionSpec spec;
    spec.name = o.name;
    spec.type = static_cast<tsr_option_type>(o.type);
    if (o.type > TSR_OPT_INT_LIST) return Status::Invalid(file + ": option " + spec.name + " has an unknown type");
    if (o.default_value) spec.default_value = o.default_value;
    spec.meaning = str_or(o.meaning);
    spec.choices = split(str_or(o.choices), '|');
    if (spec.type == TSR_OPT_ENUM && spec.choices.empty())
      return Status::Invalid(file + ": enum option " + spec.name + " lists no choices");
    p->options_.push_back(std::move(spec));
  }
  return std::shared_ptr<const Plugin>(std::move(p));
}

Plugin::~Plugin() {
  if (handle_) dlclose(handle_);
}

// ---------------------------------------------------------------------------------------------
// Search

std::vector<std::string> plugin_search_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("TESSERA_PLUGIN_PATH"))
    for (const std::string& d : split(env, ':')) dirs.push_back(d);
  std::error_code ec;
  Dl_info self{};
  fs::path me;  // this library's file
  if (dladdr(reinterpret_cast<const void*>(&plugin_search_dirs), &self) && self.dli_fname)
    me = fs::weakly_canonical(fs::absolute(self.dli_fname), ec);
#ifdef TESSERA_BUILD_PLUGIN_DIR
  // The build tree, for a library still in it (an installed copy must not see the tree it came from).
  const fs::path tree = fs::weakly_canonical(TESSERA_BUILD_DIR, ec);
  const bool in_tree = !me.empty() && !tree.empty() &&
                       std::mismatch(tree.begin(), tree.end(), me.begin(), me.end()).first == tree.end();
  if (in_tree && fs::is_directory(TESSERA_BUILD_PLUGIN_DIR, ec)) dirs.push_back(TESSERA_BUILD_PLUGIN_DIR);
#endif
  // The install prefix: <libdir>/tessera/plugins beside this library, wherever it was installed.
  if (!me.empty()) {
    const fs::path lib = me.parent_path() / "tessera" / "plugins";
    if (fs::is_directory(lib, ec)) dirs.push_back(lib.lexically_normal().string());
  }
  return dirs;
}

Result<std::string> find_plugin(const std::string& name, const std::vector<std::string>& dirs) {
  std::vector<std::string> all = dirs;
  for (const std::string& d : plugin_search_dirs()) all.push_back(d);
  const std::string leaf = "libtessera_" + name + ".so";
  for (const std::string& d : all) {
    const fs::path p = fs::path(d) / leaf;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return fs::absolute(p, ec).lexically_normal().string();
  }
  std::string where;
  for (const std::string& d : all) where += (where.empty() ? "" : ", ") + d;
  return Status::NotFound("no plugin named \"" + name + "\": " + leaf + " is in none of " +
                          (where.empty() ? std::string("the search directories") : where) +
                          " (set TESSERA_PLUGIN_PATH, or give the plugin's path; `tessera plugins` lists what is found)");
}

PluginScan scan_plugins(const std::vector<std::string>& dirs) {
  PluginScan scan;
  std::vector<std::string> seen;
  for (const std::string& d : dirs) {
    std::error_code ec;
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(d, ec)) {
      const std::string leaf = entry.path().filename().string();
      if (leaf.rfind("libtessera_", 0) == 0 && entry.path().extension() == ".so") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      const std::string leaf = fs::path(f).filename().string();
      if (std::find(seen.begin(), seen.end(), leaf) != seen.end()) {
        scan.refused.push_back({f, "shadowed by an earlier " + leaf + " in the search path"});
        continue;
      }
      seen.push_back(leaf);
      Result<std::shared_ptr<const Plugin>> p = Plugin::load(f);
      if (p.ok()) scan.found.push_back({(*p)->name(), (*p)->modality(), (*p)->version(), f});
      else scan.refused.push_back({f, p.status().message()});
    }
  }
  return scan;
}

// ---------------------------------------------------------------------------------------------
// Encoder

struct Encoder::State {
  std::shared_ptr<const Plugin> plugin;
  void* instance = nullptr;
  tsr_encoder_info info{};
  ItemLimits limits;
  std::unique_ptr<plugin_workers::Worker> worker;  // set by isolate(): encode() runs there
  ~State() {
    worker.reset();  // first: the worker's process shares nothing with us, but stop it before we unload
    if (instance) plugin->table()->destroy(instance);
  }
};

namespace {

tsr_error fresh_error() {
  tsr_error e;
  std::memset(&e, 0, sizeof e);
  e.size = sizeof e;
  return e;
}

std::string plugin_label(const Plugin& p) { return "plugin " + p.name() + " (" + p.file() + ")"; }

// Copies one sequence out of the plugin's memory, checking everything the host relies on.
Result<TokenRows> take_rows(const tsr_rows& r, const tsr_encoder_info& info, const std::string& who) {
  auto bad = [&](const std::string& what) {
    return Status::Internal(who + " returned malformed rows: " + what + " (a bug in the plugin)");
  };
  if (r.size < sizeof(tsr_rows)) return bad("tsr_rows is too small");
  if (r.kind != info.rows_kind) return bad("rows of another kind than the encoder described");
  if (r.n_rows == 0) return bad("an empty sequence");
  if (!r.positions || !r.roles || !r.provenance) return bad("missing positions, roles or provenance");
  TokenRows t;
  t.kind = static_cast<tsr_rows_kind>(r.kind);
  const size_t n = r.n_rows;
  if (r.kind == TSR_ROWS_IDS) {
    if (!r.ids) return bad("no ids");
    t.ids.assign(r.ids, r.ids + n);
    for (size_t i = 0; i < n; ++i)
      if (t.ids[i] < 0 || t.ids[i] >= info.vocab_size)
        return bad("id " + std::to_string(t.ids[i]) + " at row " + std::to_string(i) + " is outside [0, " +
                   std::to_string(info.vocab_size) + ")");
  } else {
    if (!r.features || r.width != info.width) return bad("no features, or rows of another width");
    t.features = Tensor::empty({static_cast<int64_t>(n), static_cast<int64_t>(r.width)});
    std::memcpy(t.features.raw_data(), r.features, t.features.nbytes());
    const float* f = t.features.data<float>();
    for (int64_t i = 0; i < t.features.numel(); ++i)
      if (!std::isfinite(f[i])) return bad("a non-finite feature value in row " + std::to_string(i / r.width));
  }
  t.positions.resize(n);
  for (size_t i = 0; i < n; ++i) t.positions[i] = {r.positions[2 * i], r.positions[2 * i + 1]};
  t.roles.assign(r.roles, r.roles + n);
  for (size_t i = 0; i < n; ++i)
    if (t.roles[i] > TSR_ROLE_UNK) return bad("unknown role " + std::to_string(t.roles[i]) + " at row " + std::to_string(i));
  t.provenance.assign(r.provenance, r.provenance + n);
  t.grid_rows = static_cast<int>(r.grid_rows);
  t.grid_cols = static_cast<int>(r.grid_cols);
  const tsr_picture& pic = r.picture;
  if (pic.size >= sizeof(tsr_picture) && pic.width > 0 && pic.height > 0) {
    if (!pic.pixels || (pic.channels != 1 && pic.channels != 3)) return bad("a picture without pixels or of 2 or 4 channels");
    t.picture.width = static_cast<int>(pic.width);
    t.picture.height = static_cast<int>(pic.height);
    t.picture.channels = static_cast<int>(pic.channels);
    t.picture.pixels.assign(pic.pixels, pic.pixels + static_cast<size_t>(pic.width) * pic.height * pic.channels);
    t.picture.x0 = pic.x0;
    t.picture.x1 = pic.x1;
    t.picture.y0 = pic.y0;
    t.picture.y1 = pic.y1;
  }
  t.label = str_or(r.label);
  return t;
}

}  // namespace

const Plugin& Encoder::plugin() const { return *state_->plugin; }
const tsr_encoder_info& Encoder::info() const { return state_->info; }

Result<Encoder> Encoder::create(std::shared_ptr<const Plugin> plugin,
                                const std::vector<std::pair<std::string, std::string>>& options) {
  std::vector<tsr_option_value> values;
  for (const auto& [name, value] : options) values.push_back({sizeof(tsr_option_value), name.c_str(), value.c_str()});
  auto state = std::make_shared<State>();
  state->plugin = plugin;
  tsr_error err = fresh_error();
  const tsr_plugin* t = plugin->table();
  const int32_t rc = t->create(values.data(), static_cast<uint32_t>(values.size()), &state->instance, &err);
  if (rc != TSR_OK) {
    state->instance = nullptr;
    const std::string option = err.option[0] ? std::string("option ") + err.option + ": " : "";
    return Status(code_of(rc), plugin_label(*plugin) + ": " + option + err.message);
  }
  state->info.size = sizeof(tsr_encoder_info);
  err = fresh_error();
  if (t->describe(state->instance, &state->info, &err) != TSR_OK)
    return Status(code_of(err.code), plugin_label(*plugin) + ": " + err.message);
  const tsr_encoder_info& i = state->info;
  if ((i.rows_kind == TSR_ROWS_IDS && i.vocab_size <= 0) || (i.rows_kind == TSR_ROWS_FEATURES && i.width == 0) ||
      i.rows_kind > TSR_ROWS_FEATURES)
    return Status::Internal(plugin_label(*plugin) + ": describes its rows inconsistently (a bug in the plugin)");
  Encoder e;
  e.state_ = std::move(state);
  return e;
}

namespace {

// The plugin's encode() in this process: the rows of every sequence counted against the row limit
// before any is copied, then copied and checked.
Result<std::vector<TokenRows>> encode_here(const Encoder::State& state, const PluginItem& item) {
  const tsr_plugin* t = state.plugin->table();
  const tsr_item in{sizeof(tsr_item), item.id.c_str(), item.source.empty() ? nullptr : item.source.c_str(),
                    reinterpret_cast<const uint8_t*>(item.data.data()), item.data.size(), item.source_offset,
                    item.source_line};
  tsr_error err = fresh_error();
  tsr_encoding* enc = nullptr;
  int32_t rc = TSR_INTERNAL;
  const std::string who = plugin_label(*state.plugin);
  // A plugin must not let an exception cross the C ABI (plugin.hpp's plugins never do); one that
  // does is caught here rather than ending the process in std::terminate.
  try {
    rc = t->encode(state.instance, &in, &enc, &err);
  } catch (const std::bad_alloc&) {
    return Status::Internal(item.id + ": " + who + " ran out of memory and let std::bad_alloc escape encode() (a bug in the plugin)");
  } catch (const std::exception& e) {
    return Status::Internal(item.id + ": " + who + " threw a C++ exception out of encode(): " + e.what() + " (a bug in the plugin)");
  } catch (...) {
    return Status::Internal(item.id + ": " + who + " threw a C++ exception out of encode() (a bug in the plugin)");
  }
  if (rc != TSR_OK) {
    // plugin.hpp's words for a std::bad_alloc: say whose, and in a worker, which limit it met.
    if (std::strcmp(err.message, "out of memory") == 0)
      return Status(code_of(rc), item.id + ": " + who + " ran out of memory encoding it" +
                                     (state.worker && state.limits.worker_memory_mb > 0
                                          ? " (a worker may map runtime.worker_memory_mb = " +
                                                std::to_string(state.limits.worker_memory_mb) +
                                                " MiB more than it started with: raise it, or make such items smaller)"
                                          : ""));
    return Status(code_of(rc), err.message);
  }
  std::vector<TokenRows> out;
  Status problem;
  if (!enc || enc->size < sizeof(tsr_encoding) || enc->n_sequences == 0 || !enc->sequences) {
    problem = Status::Internal(who + " returned no sequences for " + item.id + " (a bug in the plugin)");
  } else {
    uint64_t rows = 0;
    for (uint32_t s = 0; s < enc->n_sequences; ++s) rows += enc->sequences[s].n_rows;
    if (state.limits.max_item_rows > 0 && rows > static_cast<uint64_t>(state.limits.max_item_rows))
      problem = Status::OutOfRange(item.id + ": " + who + " made " + std::to_string(rows) + " rows in " +
                                   std::to_string(enc->n_sequences) + " sequence(s), more than runtime.max_item_rows = " +
                                   std::to_string(state.limits.max_item_rows) +
                                   " (give the plugin a maximum length or fewer windows, or raise runtime.max_item_rows)");
    for (uint32_t s = 0; s < enc->n_sequences && problem.ok(); ++s) {
      Result<TokenRows> r = take_rows(enc->sequences[s], state.info, who);
      if (r.ok()) out.push_back(std::move(r).value());
      else problem = r.status();
    }
  }
  if (enc) t->release(state.instance, enc);
  if (!problem.ok()) return problem;
  return out;
}

}  // namespace

Result<std::vector<TokenRows>> Encoder::encode(const PluginItem& item) const {
  const ItemLimits& lim = state_->limits;
  if (lim.max_item_bytes > 0 && item.data.size() > static_cast<uint64_t>(lim.max_item_bytes))
    return Status::OutOfRange(item.id + ": " + std::to_string(item.data.size()) + " bytes, more than runtime.max_item_bytes = " +
                              std::to_string(lim.max_item_bytes) + " (split the input, or raise runtime.max_item_bytes)");
  if (state_->worker) return state_->worker->encode(item);
  return encode_here(*state_, item);
}

void Encoder::limit(const ItemLimits& limits) { state_->limits = limits; }
const ItemLimits& Encoder::limits() const { return state_->limits; }
bool Encoder::isolated() const { return state_->worker != nullptr; }
int64_t Encoder::worker_pid() const { return state_->worker ? state_->worker->pid() : 0; }
int64_t Encoder::workers_started() const { return state_->worker ? state_->worker->started() : 0; }

Status Encoder::isolate(const ItemLimits& limits) {
  state_->worker.reset();
  state_->limits = limits;
  // The answer's bound: what max_item_rows rows of this encoder's kind can take on the wire
  // (ids or features, positions, role, provenance), plus pictures and labels.
  const uint64_t per_row = 8 + 1 + sizeof(tsr_provenance) +
                           (state_->info.rows_kind == TSR_ROWS_FEATURES ? 4ull * state_->info.width : 4);
  uint64_t cap = 0;
  const uint64_t rows = limits.max_item_rows > 0 ? static_cast<uint64_t>(limits.max_item_rows) : (uint64_t{1} << 32);
  if (__builtin_mul_overflow(rows, per_row, &cap) || __builtin_add_overflow(cap, uint64_t{1} << 30, &cap) ||
      cap > static_cast<uint64_t>(INT64_MAX))
    cap = static_cast<uint64_t>(INT64_MAX);
  const State* self = state_.get();  // the worker lives inside *self, so it never outlives it
  state_->worker = std::make_unique<plugin_workers::Worker>(
      [self](const PluginItem& item) { return encode_here(*self, item); }, limits, plugin_label(*state_->plugin),
      static_cast<int64_t>(cap));
  Status st = state_->worker->start();
  if (!st.ok()) state_->worker.reset();
  return st;
}

int32_t Encoder::mask_id() const {
  const tsr_encoder_info& i = state_->info;
  if (i.rows_kind != TSR_ROWS_IDS || i.has_mask != 1) return -1;
  return i.mask_id >= 0 && i.mask_id < i.vocab_size ? i.mask_id : -1;
}

bool Encoder::augments() const {
  const tsr_plugin* t = state_->plugin->table();
  return t->size >= kFirstTableSize + sizeof t->augment && t->augment && state_->info.augments == 1;
}

Status Encoder::augment(const TokenRows& rows, uint64_t seed, float* features) const {
  if (!augments())
    return Status::Unsupported(plugin_label(*state_->plugin) + " has no augmentation under these options");
  if (rows.kind != TSR_ROWS_FEATURES || rows.features.rank() != 2)
    return Status::Invalid(plugin_label(*state_->plugin) + ": only feature rows are augmented");
  std::vector<int32_t> positions(2 * rows.positions.size());
  for (size_t i = 0; i < rows.positions.size(); ++i) {
    positions[2 * i] = rows.positions[i][0];
    positions[2 * i + 1] = rows.positions[i][1];
  }
  tsr_rows r{};
  r.size = sizeof r;
  r.kind = TSR_ROWS_FEATURES;
  r.n_rows = static_cast<uint32_t>(rows.size());
  r.width = static_cast<uint32_t>(rows.features.dim(1));
  r.features = rows.features.data<float>();
  r.positions = positions.data();
  r.roles = rows.roles.data();
  r.provenance = rows.provenance.empty() ? nullptr : rows.provenance.data();
  r.grid_rows = static_cast<uint32_t>(rows.grid_rows);
  r.grid_cols = static_cast<uint32_t>(rows.grid_cols);
  r.label = rows.label.c_str();
  tsr_error err = fresh_error();
  const int32_t rc = state_->plugin->table()->augment(state_->instance, &r, seed, features, &err);
  if (rc != TSR_OK) return Status(code_of(rc), plugin_label(*state_->plugin) + ": augment: " + err.message);
  for (int64_t i = 0; i < rows.features.numel(); ++i)
    if (!std::isfinite(features[i]))
      return Status::Internal(plugin_label(*state_->plugin) + ": augment gave a non-finite value in row " +
                              std::to_string(i / r.width) + " (a bug in the plugin)");
  return Status::Ok();
}

Result<std::string> Encoder::decode(const std::vector<int32_t>& ids) const {
  const tsr_plugin* t = state_->plugin->table();
  std::string text(256, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    tsr_error err = fresh_error();
    size_t length = 0;
    const int32_t rc = t->decode(state_->instance, ids.data(), ids.size(), text.data(), text.size(), &length, &err);
    if (rc == TSR_OK) {
      text.resize(length);
      return text;
    }
    if (rc != TSR_OUT_OF_RANGE || length + 1 <= text.size())
      return Status(code_of(rc), plugin_label(*state_->plugin) + ": " + err.message);
    text.assign(length + 1, '\0');
  }
  return Status::Internal(plugin_label(*state_->plugin) + ": decode keeps asking for more room");
}

}  // namespace tessera
