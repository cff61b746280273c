// Training checkpoints (checkpoint.h). Every change a reader can see is one rename: a complete,
// fsync'ed temporary folder becomes step-NNNNNN, then a new `latest` replaces the old one, then
// old folders are renamed out of sight before they are deleted. A kill at any moment therefore
// leaves `latest` naming a complete folder, plus at most some hidden temporary ones.
#include "tessera/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>

#include "tessera/fileio.h"
#include "tessera/safetensors.h"

namespace tessera {

namespace {

// A file's checksum: FNV-1a-64 (fileio.h) in hex, of a file given whole or as pieces (chained
// through them: the hash of their concatenation). It catches torn and corrupted files; it is not
// meant to resist someone forging a checkpoint.
std::string checksum(std::span<const std::string_view> pieces) {
  uint64_t h = kFnvOffset;
  for (std::string_view p : pieces) h = fnv1a(p.data(), p.size(), h);
  return hex64(h);
}
std::string checksum(std::string_view bytes) { return checksum(std::span<const std::string_view>(&bytes, 1)); }

namespace fs = std::filesystem;
using json = nlohmann::json;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

constexpr char kFormat[] = "tessera.checkpoint";
constexpr int kVersion = 1;
constexpr char kWeightsFile[] = "weights.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kStateFile[] = "state.json";
constexpr char kLatestFile[] = "latest";
constexpr std::string_view kStepPrefix = "step-";
constexpr std::string_view kTempInfix = ".tmp.";

// state.json is written as text with a fixed frame, so that its own checksum and the trainer's
// JSON can be found without re-serialising anything: ..., then these two keys, then kEnd.
constexpr std::string_view kSelfSumKey = "\n  \"state_fnv1a\": \"";
constexpr std::string_view kTrainerKey = ",\n  \"trainer\": ";
constexpr std::string_view kEnd = "\n}\n";
constexpr size_t kSumHexDigits = 16;

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

// The step a folder name stands for, if it is exactly what checkpoint_folder_name writes.
std::optional<int64_t> step_of_folder(std::string_view name) {
  if (name.substr(0, kStepPrefix.size()) != kStepPrefix) return std::nullopt;
  const std::string_view digits = name.substr(kStepPrefix.size());
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  if (checkpoint_folder_name(step) != name) return std::nullopt;  // "step-12", "step-+0000012"
  return step;
}

struct StepFolder {
  int64_t step;
  std::string name;
};

// The step folders in dir, newest first; the rest (temporaries, `latest`, stray files) ignored.
Result<std::vector<StepFolder>> list_step_folders(const std::string& dir) {
  std::vector<StepFolder> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::optional<int64_t> step = step_of_folder(name);
    std::error_code type_ec;
    if (step && it->is_directory(type_ec)) out.push_back({*step, name});
  }
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return out;
    return Status::IoError(dir + ": cannot list the checkpoint folder: " + ec.message());
  }
  std::sort(out.begin(), out.end(), [](const StepFolder& a, const StepFolder& b) { return a.step > b.step; });
  return out;
}

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(dir + ": cannot open the folder to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::IoError(dir + ": cannot fsync the folder: " + std::strerror(err));
  return Status::Ok();
}

// ".<base>.tmp.<pid>.<n>": the pattern write_file_atomic also uses for its temporary files, so
// one sweep finds both kinds of leftovers.
std::string temp_name(const std::string& base) {
  static std::atomic<unsigned> counter{0};
  return "." + base + std::string(kTempInfix) + std::to_string(::getpid()) + "." +
         std::to_string(counter.fetch_add(1));
}

// The process that made a temporary of ours, or nothing for any other name.
std::optional<pid_t> temp_owner(std::string_view name) {
  const size_t infix = name.rfind(kTempInfix);
  if (name.empty() || name[0] != '.' || infix == std::string_view::npos) return std::nullopt;
  const std::string_view base = name.substr(1, infix - 1);
  if (base != kLatestFile && !step_of_folder(base)) return std::nullopt;
  const std::string_view rest = name.substr(infix + kTempInfix.size());  // "<pid>.<n>"
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (ec != std::errc() || pid <= 0 || end == rest.data() + rest.size() || *end != '.') return std::nullopt;
  return pid;
}

// Removes what killed writers left in dir. Best effort: a leftover only costs space.
void sweep_stale_temporaries(const std::string& dir) {
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<pid_t> owner = temp_owner(it->path().filename().string());
    if (owner && *owner != ::getpid() && ::kill(*owner, 0) != 0 && errno == ESRCH)
      stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

std::string free_space_note(const std::string& dir) {
  struct statvfs v {};
  if (::statvfs(dir.c_str(), &v) != 0) return "";
  return "; the file system holding " + dir + " has " +
         std::to_string(static_cast<uint64_t>(v.f_bavail) * v.f_frsize) + " bytes free";
}

// The tensors as safetensors pieces (views of the tensors, no copy of a large optimizer state in
// memory), refusing what read_checkpoint could not load back.
Result<safetensors::Pieces> serialize_tensors(const std::string& path, const NamedTensors& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors)
    if (t.defined() && t.dtype() == DType::f64)
      return Status::Invalid(path + ": tensor " + in_quotes(name) +
                             " is f64, which safetensors reading does not load back (store it as f32, "
                             "or as two f32 halves if the precision matters)");
  Result<safetensors::Pieces> pieces = safetensors::serialize_pieces(tensors, metadata);
  if (!pieces.ok()) return pieces.status().with_prefix(path);
  return pieces;
}

// Writes one file into the temporary folder; a failure also says how much space was asked for.
Status write_part(const std::string& path, std::span<const std::string_view> pieces, uint64_t checkpoint_bytes,
                  const std::string& dir) {
  const Status s = write_file_atomic(path, pieces);
  if (s.ok()) return s;
  uint64_t bytes = 0;
  for (std::string_view p : pieces) bytes += p.size();
  return Status(s.code(), s.message() + " (the file needs " + std::to_string(bytes) +
                              " bytes, the whole checkpoint about " + std::to_string(checkpoint_bytes) +
                              " bytes" + free_space_note(dir) + ")");
}

uint64_t tensor_bytes(const NamedTensors& tensors) {
  uint64_t n = 0;
  for (const auto& entry : tensors) n += entry.second.defined() ? entry.second.nbytes() : 0;
  return n;
}

// A string as a JSON string literal, or why it cannot be one.
Result<std::string> json_literal(const std::string& s, const std::string& what) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    return Status::Invalid(what + " is not valid UTF-8 (it is stored as JSON text)");
  }
}

// state.json's text, its own checksum filled in (see kSelfSumKey).
std::string state_text(const Checkpoint& c, const std::string& hash_literal, const json& files) {
  std::string t = "{\n  \"format\": " + in_quotes(kFormat) + ",\n  \"version\": " + std::to_string(kVersion) +
                  ",\n  \"step\": " + std::to_string(c.step) + ",\n  \"config_hash\": " + hash_literal +
                  ",\n  \"files\": " + files.dump() + ",";
  const size_t sum_at = t.size() + kSelfSumKey.size();
  t += kSelfSumKey;
  t += std::string(kSumHexDigits, '0') + "\"";
  if (!c.state_json.empty()) {
    t += kTrainerKey;
    t += c.state_json;
  }
  t += kEnd;
  t.replace(sum_at, kSumHexDigits, checksum(t));
  return t;
}

// Puts the complete temporary folder at `final_path`, swapping it with an existing folder of
// the same step in one step (renameat2 RENAME_EXCHANGE), so that a complete folder is always
// there; the old one, now at `temp`, is removed.
Status install_folder(const std::string& temp, const std::string& final_path) {
  if (::rename(temp.c_str(), final_path.c_str()) == 0) return Status::Ok();
  if (errno != EEXIST && errno != ENOTEMPTY)
    return Status::IoError(final_path + ": cannot rename the complete temporary folder " + temp +
                           " into place: " + std::strerror(errno));
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0)
    return Status::IoError(final_path + ": exists, and cannot be swapped atomically with the new " + temp +
                           ": " + std::strerror(errno) +
                           " (this file system lacks renameat2 RENAME_EXCHANGE; remove the old folder "
                           "by hand if `latest` does not name it)");
  std::error_code ec;
  fs::remove_all(temp, ec);  // the old folder; a leftover is swept by a later write
  return Status::Ok();
}

// Keeps the newest `keep` folders at or below `step` (`newest` among them); folders of later
// steps are left alone. Each goes out of sight (renamed) before it is deleted, so a kill never
// leaves a half-deleted step folder.
Status remove_old_folders(const std::string& dir, int64_t step, int keep, const std::string& newest) {
  TSR_ASSIGN_OR_RETURN(std::vector<StepFolder> folders, list_step_folders(dir));
  std::string problems;
  int kept = 0;
  for (const StepFolder& f : folders) {
    if (f.step > step) continue;
    if (f.name == newest || kept < keep) {
      ++kept;
      continue;
    }
    const std::string path = join(dir, f.name), hidden = join(dir, temp_name(f.name));
    std::error_code ec;
    if (::rename(path.c_str(), hidden.c_str()) != 0)
      problems += "; cannot rename " + path + " out of sight: " + std::strerror(errno);
    else if (fs::remove_all(hidden, ec); ec)
      problems += "; cannot delete " + hidden + ": " + ec.message();
  }
  if (problems.empty()) return Status::Ok();
  return Status::IoError(join(dir, newest) +
                         " is complete and `latest` names it, but removing older checkpoints "
                         "failed" +
                         problems);
}

// ---- reading ----

// Checks state.json's own checksum and returns the trainer's JSON as it was written.
Result<std::string> verify_state_text(const std::string& path, const std::string& text) {
  const size_t key = text.find(kSelfSumKey);
  const size_t at = key + kSelfSumKey.size();
  if (key == std::string::npos || at + kSumHexDigits + 1 > text.size())
    return Status::IoError(path +
                           ": no state_fnv1a field: the file is torn, corrupted or not a Tessera "
                           "checkpoint's state.json");
  std::string zeroed = text;
  zeroed.replace(at, kSumHexDigits, kSumHexDigits, '0');
  const std::string recorded = text.substr(at, kSumHexDigits), actual = checksum(zeroed);
  if (actual != recorded)
    return Status::IoError(path + ": checksum mismatch: its text hashes to fnv1a " + actual +
                           " but it records " + recorded +
                           " (the file is torn or corrupted, or was edited by hand)");
  // The checksum holds, so the frame is the one state_text wrote: `"`, then the trainer or the end.
  const std::string after = text.substr(at + kSumHexDigits + 1);
  if (after == kEnd) return std::string();
  if (after.size() < kTrainerKey.size() + kEnd.size() ||
      after.compare(0, kTrainerKey.size(), kTrainerKey) != 0 ||
      after.compare(after.size() - kEnd.size(), kEnd.size(), kEnd) != 0)
    return Status::ParseError(path +
                              ": the text after state_fnv1a is not the \"trainer\" field and the end");
  return after.substr(kTrainerKey.size(), after.size() - kTrainerKey.size() - kEnd.size());
}

struct FileRecord {
  uint64_t bytes = 0;
  std::string fnv1a;
};

// The size and checksum state.json records for one of the tensor files.
Result<FileRecord> file_record(const std::string& state_path, const json& state, const char* name) {
  const json* f = nullptr;
  if (const auto files = state.find("files"); files != state.end() && files->is_object())
    if (const auto it = files->find(name); it != files->end()) f = &*it;
  if (f == nullptr || !f->is_object() || !f->contains("bytes") || !f->at("bytes").is_number_unsigned() ||
      !f->contains("fnv1a") || !f->at("fnv1a").is_string())
    return Status::ParseError(state_path + ": files." + name + " is missing or lacks bytes and fnv1a");
  return FileRecord{f->at("bytes").get<uint64_t>(), f->at("fnv1a").get<std::string>()};
}

// One tensor file, checked against its record before it is parsed; owned copies of its tensors.
Result<NamedTensors> read_tensor_file(const std::string& path, const FileRecord& want, int64_t step) {
  TSR_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> map, MappedFile::open(path));
  if (map->size() < want.bytes)
    return Status::IoError(path + ": truncated: " + std::to_string(map->size()) +
                           " bytes, state.json records " + std::to_string(want.bytes) +
                           " (the file was cut short or torn)");
  if (map->size() > want.bytes)
    return Status::IoError(path + ": " + std::to_string(map->size()) + " bytes, state.json records " +
                           std::to_string(want.bytes) + " (the file was appended to or replaced)");
  const std::string actual =
      checksum(std::string_view(reinterpret_cast<const char*>(map->data()), map->size()));
  if (actual != want.fnv1a)
    return Status::IoError(path + ": checksum mismatch: fnv1a " + actual + ", state.json records " +
                           want.fnv1a + " (the file is corrupted)");
  TSR_ASSIGN_OR_RETURN(safetensors::File file, safetensors::File::open(path));
  const auto meta = file.metadata().find("step");
  if (meta == file.metadata().end() || meta->second != std::to_string(step))
    return Status::IoError(path + ": its metadata names step " +
                           (meta == file.metadata().end() ? std::string("(none)") : meta->second) +
                           ", state.json step " + std::to_string(step) +
                           " (files from different checkpoints)");
  NamedTensors out;
  for (const safetensors::TensorInfo& info : file.tensors()) {
    TSR_ASSIGN_OR_RETURN(Tensor view, file.get(info.name));
    out.emplace_back(info.name, view.clone());  // owned: the mapping is read-only
  }
  return out;
}

// read_checkpoint_at, and with `expect_step` also that the folder's name matches its content.
Result<Checkpoint> read_step_folder(const std::string& step_dir, std::optional<int64_t> expect_step) {
  const std::string state_path = join(step_dir, kStateFile);
  TSR_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  TSR_ASSIGN_OR_RETURN(std::string trainer, verify_state_text(state_path, text));
  json state;
  try {
    state = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond a double
    return Status::ParseError(state_path + ": not valid JSON: " + e.what());
  }
  if (!state.is_object() || state.value("format", json()) != kFormat)
    return Status::ParseError(state_path + ": not a Tessera checkpoint (format is not " + in_quotes(kFormat) +
                              ")");
  if (state.value("version", json()) != kVersion)
    return Status::Unsupported(state_path + ": checkpoint version " + state.value("version", json()).dump() +
                               "; this Tessera reads version " + std::to_string(kVersion) +
                               " (use the Tessera that wrote it)");
  if (!state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0 ||
      !state.contains("config_hash") || !state["config_hash"].is_string())
    return Status::ParseError(state_path + ": step (an integer >= 0) or config_hash (a string) is missing");

  Checkpoint c;
  c.step = state["step"].get<int64_t>();
  if (expect_step && *expect_step != c.step)
    return Status::IoError(state_path + ": records step " + std::to_string(c.step) + " but its folder is " +
                           checkpoint_folder_name(*expect_step) + " (the folder was renamed or overwritten)");
  c.config_hash = state["config_hash"].get<std::string>();
  c.state_json = std::move(trainer);
  TSR_ASSIGN_OR_RETURN(FileRecord weights_record, file_record(state_path, state, kWeightsFile));
  TSR_ASSIGN_OR_RETURN(FileRecord optimizer_record, file_record(state_path, state, kOptimizerFile));
  TSR_ASSIGN_OR_RETURN(NamedTensors weights,
                       read_tensor_file(join(step_dir, kWeightsFile), weights_record, c.step));
  TSR_ASSIGN_OR_RETURN(c.optimizer,
                       read_tensor_file(join(step_dir, kOptimizerFile), optimizer_record, c.step));
  c.weights = Parameters(std::move(weights));
  c.path = step_dir;
  return c;
}

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

Status write_checkpoint(const std::string& dir, const Checkpoint& c, int keep) {
  const std::string name = checkpoint_folder_name(c.step), final_path = join(dir, name);
  const std::string what = "checkpoint " + final_path;
  if (keep < 1)
    return Status::Invalid(what + ": keep is " + std::to_string(keep) + " (keep at least 1 checkpoint)");
  if (c.step < 0) return Status::Invalid(what + ": step " + std::to_string(c.step) + " is negative");
  if (!c.state_json.empty() && !json::accept(c.state_json))
    return Status::Invalid(what + ": state_json is not one valid JSON value (it is stored verbatim as JSON)");
  TSR_ASSIGN_OR_RETURN(std::string hash_literal, json_literal(c.config_hash, what + ": config_hash"));

  std::error_code ec;
  if (fs::create_directories(dir, ec)) {
    // The new folder's own entry must be durable too.
    fs::path folder = fs::path(dir).lexically_normal();
    if (!folder.has_filename()) folder = folder.parent_path();  // "a/b/"
    TSR_RETURN_IF_ERROR(fsync_dir(folder.has_parent_path() ? folder.parent_path().string() : "."));
  } else if (ec) {
    return Status::IoError(dir + ": cannot create the checkpoint folder: " + ec.message());
  }
  sweep_stale_temporaries(dir);

  // What failure leaves behind, for the messages.
  const Result<std::string> old_latest = read_file(join(dir, kLatestFile));
  const std::string unchanged = old_latest.ok()
                                    ? "nothing changed: `latest` still names " +
                                          old_latest.value().substr(0, old_latest.value().find('\n'))
                                    : std::string("nothing changed (there was no earlier checkpoint)");

  const std::string temp = join(dir, temp_name(name));
  if (::mkdir(temp.c_str(), 0777) != 0)
    return Status::IoError(temp + ": cannot create the temporary checkpoint folder: " + std::strerror(errno) +
                           "; " + unchanged);
  auto fail = [&](const Status& s) {
    fs::remove_all(temp, ec);
    return Status(s.code(),
                  what + ": " + s.message() + "; " + unchanged +
                      (ec ? " (the temporary folder " + temp + " could not be removed: " + ec.message() + ")"
                          : " (the temporary folder was removed)"));
  };

  const NamedTensors weights(c.weights.begin(), c.weights.end());
  const uint64_t checkpoint_bytes =
      tensor_bytes(weights) + tensor_bytes(c.optimizer) + c.state_json.size() + c.config_hash.size() + 4096;
  const std::map<std::string, std::string> metadata = {
      {"format", kFormat}, {"step", std::to_string(c.step)}, {"config_hash", c.config_hash}};
  json files = json::object();
  // Each file written straight from the tensors (no copy of them in memory), hashed on the way.
  // write_file_atomic fsyncs each file and then the temporary folder, so the folder is durable
  // once state.json is.
  for (const auto& [file_name, tensors] :
       {std::pair<const char*, const NamedTensors*>{kWeightsFile, &weights},
        {kOptimizerFile, &c.optimizer}}) {
    const std::string path = join(temp, file_name);
    Result<safetensors::Pieces> pieces = serialize_tensors(path, *tensors, metadata);
    if (!pieces.ok()) return fail(pieces.status());
    const std::vector<std::string_view> views = pieces->views();
    files[file_name] = {{"bytes", pieces->size()}, {"fnv1a", checksum(views)}};
    if (Status s = write_part(path, views, checkpoint_bytes, dir); !s.ok()) return fail(s);
  }
  const std::string state = state_text(c, hash_literal, files);
  const std::string_view state_piece = state;
  if (Status s = write_part(join(temp, kStateFile), std::span<const std::string_view>(&state_piece, 1),
                            checkpoint_bytes, dir);
      !s.ok())
    return fail(s);
  if (Status s = install_folder(temp, final_path); !s.ok()) return fail(s);

  // From here the new folder is complete and in place; `latest` still names the old one.
  if (Status s = fsync_dir(dir); !s.ok())
    return Status(s.code(), what + ": " + s.message() + "; `latest` was not updated");
  if (Status s = write_file_atomic(join(dir, kLatestFile), name + "\n"); !s.ok())
    return Status(s.code(), what + " is complete, but " + s.message() + "; " + unchanged);
  return remove_old_folders(dir, c.step, keep, name);
}

Result<Checkpoint> read_checkpoint_at(const std::string& step_dir) {
  return read_step_folder(step_dir, std::nullopt);
}

Result<Checkpoint> read_checkpoint(const std::string& dir) {
  const std::string latest_path = join(dir, kLatestFile);
  std::string problem, named;
  Result<std::string> latest = read_file(latest_path);
  if (latest.ok()) {
    named = latest.value();
    if (!named.empty() && named.back() == '\n') named.pop_back();
    const std::optional<int64_t> step = step_of_folder(named);
    if (!step) {
      problem = latest_path + ": names " + in_quotes(named) + ", which is not a step folder name";
    } else {
      Result<Checkpoint> c = read_step_folder(join(dir, named), step);
      if (c.ok()) return c;
      problem = latest_path + " names " + named + ", which is unusable: " + c.status().message();
    }
  } else {
    problem = latest.status().message();
  }

  TSR_ASSIGN_OR_RETURN(std::vector<StepFolder> folders, list_step_folders(dir));
  if (!latest.ok() && latest.status().code() == Code::not_found && folders.empty())
    return Status::NotFound(dir + ": no checkpoint here (no `latest` file and no step-* folders)");
  std::string skipped;
  for (const StepFolder& f : folders) {
    if (f.name == named) continue;  // already tried
    Result<Checkpoint> c = read_step_folder(join(dir, f.name), f.step);
    if (c.ok()) {
      c->warning = problem + "; using " + f.name + " instead, the newest valid checkpoint" +
                   (skipped.empty() ? "" : " (also unusable: " + skipped + ")");
      return c;
    }
    skipped += (skipped.empty() ? "" : "; ") + c.status().message();
  }
  return Status::IoError(dir + ": no valid checkpoint: " + problem + (skipped.empty() ? "" : "; " + skipped));
}

Status check_config_hash(const Checkpoint& c, const std::string& current_hash) {
  if (c.config_hash == current_hash) return Status::Ok();
  auto shown = [](const std::string& h) { return h.empty() ? std::string("(none)") : h; };
  return Status::Invalid(
      (c.path.empty() ? "" : c.path + ": ") + "the run was started with config " + shown(c.config_hash) +
      ", this config is " + shown(current_hash) +
      ": resuming would continue training under a different model or schedule (resume with "
      "the config the run was started with, or start a new run in another folder)");
}

}  // namespace tessera
