// The run folder: manifest, resume checks, the end of a run. See run_folder.h.
#include "run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace tessera::run {

namespace fs = std::filesystem;

namespace {

// 2: each finished batch with the hash of its items' content, and the files the plugins read.
// (1: batch numbers only.)
constexpr int kManifestFormat = 2;

// The lock file: flock()ed by the run that holds the folder, and holding its pid for messages.
constexpr const char* kLockFile = "run.lock";

// write_file_atomic()'s temporary files (core/src/io/fileio.cpp): ".NAME.tmp.PID.N".
bool is_temporary(const std::string& name) {
  const size_t t = name.rfind(".tmp.");
  if (name.size() < 2 || name[0] != '.' || t == std::string::npos || t < 2) return false;
  const std::string rest = name.substr(t + 5);
  const size_t dot = rest.find('.');
  auto digits = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return dot != std::string::npos && digits(rest.substr(0, dot)) && digits(rest.substr(dot + 1));
}

// The pid a lock file names, as text ("?" when it names none yet).
std::string lock_holder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() || s.find_first_not_of("0123456789") != std::string::npos ? "?" : s;
}

// What a manifest value is, for messages: its JSON type and, if short, the value.
std::string describe(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.is_number() ? "a number" : v.is_string() ? "a string" : v.is_array() ? "a list"
                     : v.is_object() ? "an object" : v.is_boolean() ? "true or false" : "null") + " (" + text + ")";
}

// A string as the manifest holds it once read back: JSON holds only UTF-8, so bytes that are not
// (a file name in Latin-1) are written as U+FFFD. Resume compares paths in this form.
std::string as_recorded(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

bool is_count(const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; }

bool is_hash(const json& v) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// Every field of a manifest that a resume reads, checked for its type and range before anything
// trusts it: a wrong one (the file damaged, or edited by hand) is a refusal naming it.
Status validate_manifest(const json& m, const std::string& path, int64_t batches) {
  auto refuse = [&](const std::string& key, const std::string& what) {
    return Status::ParseError(path + ": \"" + key + "\" " + what + "; the manifest was damaged or edited, so a resume "
                              "cannot trust it: start over with --force, or run into another folder with --out");
  };
  auto field = [&](const char* key, bool (*ok)(const json&), const char* expected) -> Status {
    if (!m.contains(key)) return refuse(key, "is missing (it should be " + std::string(expected) + ")");
    if (!ok(m[key])) return refuse(key, "is " + describe(m[key]) + ", not " + expected);
    return Status::Ok();
  };
  TSR_RETURN_IF_ERROR(field("config_hash", is_hash, "16 hex digits"));
  TSR_RETURN_IF_ERROR(field("model_hash", is_hash, "16 hex digits"));
  TSR_RETURN_IF_ERROR(field("items", is_count, "a count of items"));
  TSR_RETURN_IF_ERROR(field("state", [](const json& v) {
    return v.is_string() && (v == "running" || v == "stopped" || v == "complete");
  }, "\"running\", \"stopped\" or \"complete\""));
  auto list_of = [&](const char* key, const std::function<bool(const json&)>& ok, const std::string& expected) -> Status {
    if (!m.contains(key)) return refuse(key, "is missing (it should be a list)");
    if (!m[key].is_array()) return refuse(key, "is " + describe(m[key]) + ", not a list");
    for (const json& e : m[key])
      if (!ok(e)) return refuse(key, "lists " + describe(e) + ", not " + expected);
    return Status::Ok();
  };
  auto strings = [](const json& e, std::initializer_list<const char*> keys) {
    if (!e.is_object()) return false;
    for (const char* k : keys)
      if (!e.contains(k) || !e[k].is_string()) return false;
    return true;
  };
  TSR_RETURN_IF_ERROR(list_of("plugins", [&](const json& e) { return strings(e, {"name", "version"}); },
                              "{\"name\": ..., \"version\": ...} with strings"));
  TSR_RETURN_IF_ERROR(list_of("files", [&](const json& e) { return strings(e, {"path", "hash"}); },
                              "{\"path\": ..., \"hash\": ...} with strings"));
  TSR_RETURN_IF_ERROR(list_of("done", [&](const json& e) {
    return e.is_array() && e.size() == 2 && is_count(e[0]) && e[0].get<int64_t>() < batches && is_hash(e[1]);
  }, "[batch, content hash] with a batch from 0 to " + std::to_string(batches - 1)));
  if (m["state"] == "complete") {
    TSR_RETURN_IF_ERROR(field("sequences", is_count, "a count of sequences"));
    TSR_RETURN_IF_ERROR(field("failed", is_count, "a count of items"));
  }
  return Status::Ok();
}

}  // namespace

RunFolder::~RunFolder() {
  if (lock_fd_ < 0) return;
  // Removed while still locked: a run that opened the file meanwhile finds, once it has the lock,
  // that the path no longer leads to what it locked, and tries again (lock()).
  ::unlink((dir_ / kLockFile).c_str());
  ::close(lock_fd_);
}

Status RunFolder::lock() {
  const std::string path = (dir_ / kLockFile).string();
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return Status::IoError(path + ": cannot open the run folder's lock file: " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = lock_holder(fd);
      ::close(fd);
      if (err == EWOULDBLOCK)
        return Status::Invalid(dir_.string() + " is in use by another tessera run (pid " + holder + ", which holds " +
                               path + "): wait for it to end, or stop it (kill " + holder +
                               ": it keeps the batches it finished) and continue with --resume");
      return Status::IoError(path + ": cannot lock the run folder: " + std::strerror(err));
    }
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        const int err = errno;
        ::close(fd);
        return Status::IoError(path + ": cannot write the run's pid into the lock file: " + std::strerror(err));
      }
      lock_fd_ = fd;
      return Status::Ok();
    }
    ::close(fd);  // removed by the run that held it, between our open and our lock: again
  }
  return Status::IoError(path + ": the lock file kept being removed while this run tried to take it");
}

// The temporary files of atomic writes that a killed run left, in the folder and the folders the
// run writes into. Only runs that hold the lock write here, and this one holds it now: every such
// file is stale.
void RunFolder::remove_temporaries(bool progress) const {
  int removed = 0;
  for (const fs::path& d : {dir_, dir_ / "shards", dir_ / "attention"}) {
    std::error_code ec;
    std::vector<fs::path> stale;
    for (auto it = fs::directory_iterator(d, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      if (is_temporary(it->path().filename().string()) && it->symlink_status(ec).type() == fs::file_type::regular)
        stale.push_back(it->path());
    for (const fs::path& f : stale) removed += fs::remove(f, ec) ? 1 : 0;
  }
  if (removed > 0 && progress)
    std::fprintf(stderr, "run: removed %d temporary file(s) left in %s by a run that was killed while it wrote\n",
                 removed, dir_.c_str());
}

std::string file_hash(const std::string& path) {
  std::error_code ec;
  uint64_t h = kFnvOffset;
  auto add_file = [&h](const fs::path& file) {
    std::ifstream f(file, std::ios::binary);
    if (!f) {
      h = hash_field("unreadable", h);
      return;
    }
    std::vector<char> buf(1 << 16);
    uint64_t n = 0;
    while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0) {
      h = fnv1a(buf.data(), static_cast<size_t>(f.gcount()), h);
      n += static_cast<uint64_t>(f.gcount());
    }
    h = fnv1a(&n, sizeof n, h);
  };
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec)) files.push_back(it->path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      h = hash_field(fs::relative(f, path, ec).string(), h);
      add_file(f);
    }
  } else if (fs::exists(path, ec)) {
    add_file(path);
  } else {
    h = hash_field("missing", h);
  }
  return hex64(h);
}

// What decides a run's outputs, hashed: the resolved experiment without where the outputs go and how
// many threads decode; every parameter's bytes; the files behind the configuration's names (each
// plugin's library and the files its options name, the class names).
RunIdentity run_identity(const Experiment& exp, const Model& model,
                         const std::vector<std::shared_ptr<const Plugin>>& plugins, int64_t items, int64_t batches) {
  RunIdentity id;
  Experiment canon = exp;
  canon.outputs.dir.clear();
  canon.runtime.workers = 0;
  // Where and under which limits items are encoded does not change a finished item's outputs: a
  // resume may raise a limit that refused an item.
  canon.runtime.isolate = true;
  canon.runtime.item_timeout_s = 0;
  canon.runtime.worker_memory_mb = canon.runtime.max_item_bytes = canon.runtime.max_item_rows = 0;
  const std::string yaml = to_yaml(canon);
  id.config_hash = hex64(fnv1a(yaml.data(), yaml.size(), kFnvOffset));
  uint64_t h = kFnvOffset;
  for (const auto& [name, t] : model.parameters()) {
    const Tensor c = t.contiguous();
    h = fnv1a(c.raw_data(), c.nbytes(), fnv1a(name.data(), name.size(), h));
  }
  id.model_hash = hex64(h);
  for (const PluginConfig& pc : exp.plugins) {
    id.files.push_back({"plugin " + pc.name + "'s library", pc.file, file_hash(pc.file)});
    for (size_t i = 0; i < pc.options.size() && i < pc.option_types.size(); ++i)
      if (pc.option_types[i] == TSR_OPT_PATH && !pc.options[i].second.empty())
        id.files.push_back({"plugin " + pc.name + "'s option " + pc.options[i].first, pc.options[i].second,
                            file_hash(pc.options[i].second)});
  }
  if (!exp.task.labels.empty()) id.files.push_back({"task.labels", exp.task.labels, file_hash(exp.task.labels)});
  for (const auto& p : plugins) id.plugins.push_back({p->name(), p->version(), p->modality()});
  id.experiment = exp.file;
  id.task = task_kind_name(exp.task.kind);
  id.items = items;
  id.batch_size = exp.runtime.batch_size;
  id.batches = batches;
  return id;
}

Status RunFolder::open(const RunOptions& opt, const ResumeHooks& hooks, bool with_attention) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Status::IoError(dir_.string() + ": cannot create the run folder: " + ec.message());
  TSR_RETURN_IF_ERROR(lock());
  remove_temporaries(opt.progress);
  const fs::path manifest = dir_ / "manifest.json";
  if (fs::exists(manifest, ec)) {
    if (opt.force) {
      for (const char* leaf : {"shards", "attention"}) fs::remove_all(dir_ / leaf, ec);
      for (const char* leaf : {"manifest.json", "errors.jsonl", "index.jsonl", "predictions.jsonl", "completions.jsonl",
                               "rows.jsonl", "embeddings.npy", "hidden.npy"})
        fs::remove(dir_ / leaf, ec);
    } else if (!opt.resume) {
      return Status::Invalid(dir_.string() + " already holds a run (manifest.json): continue it with --resume, or start "
                             "over with --force, or choose another folder with --out");
    } else {
      Result<std::string> text = read_file(manifest.string());
      if (!text.ok()) return text.status();
      json m = json::parse(*text, nullptr, false);
      if (m.is_discarded() || !m.is_object())
        return Status::ParseError(manifest.string() + ": not a valid manifest (start over with --force)");
      // A value of the wrong type in a run's files (edited by hand, say) is a refusal, not an abort.
      Status resumed = Status::Ok();
      try {
        resumed = check_resume(m, opt, hooks);
      } catch (const json::exception& e) {
        resumed = Status::ParseError(manifest.string() + " (or an output beside it): a value of the wrong type: " +
                                     e.what() + " (start over with --force)");
      }
      TSR_RETURN_IF_ERROR(resumed);
      if (complete_) return Status::Ok();
    }
  }
  fs::create_directories(dir_ / "shards", ec);
  if (ec) return Status::IoError(dir_.string() + ": cannot create the run folder: " + ec.message());
  if (with_attention) fs::create_directories(dir_ / "attention", ec);
  return write_manifest("running");
}

// --resume: refuses when what the outputs are computed from changed (the configuration, the
// weights, the plugins and the files they read, the number of items), and otherwise keeps the
// finished batches whose items are as they were and redoes the others. A finished run whose
// items changed is cut back into shards first (unmerge), so that it is merged again at the end.
Status RunFolder::check_resume(const json& m, const RunOptions& opt, const ResumeHooks& hooks) {
  const std::string cannot = "cannot resume " + dir_.string() + ": ";
  const std::string fresh = "start over with --force, or run into another folder with --out";
  const std::string path = (dir_ / "manifest.json").string();
  if (!m.contains("format") || !m["format"].is_number_integer())
    return Status::ParseError(path + ": \"format\" is " + (m.contains("format") ? describe(m["format"]) : "missing") +
                              ", not a format number; the manifest was damaged or edited, so a resume cannot trust it: " +
                              fresh);
  const int64_t format = m["format"].get<int64_t>();
  if (format < kManifestFormat)
    return Status::Invalid(cannot + "its manifest.json (format " + std::to_string(format) +
                           ") does not record what each finished batch was computed from, so a resume cannot tell "
                           "which of them are stale (it was written by an earlier tessera); " + fresh);
  if (format > kManifestFormat)
    return Status::Invalid(cannot + "its manifest.json has format " + std::to_string(format) + ", newer than this "
                           "tessera's (" + std::to_string(kManifestFormat) + "); resume it with the tessera that started "
                           "it, or " + fresh);
  TSR_RETURN_IF_ERROR(validate_manifest(m, path, id_.batches));
  auto refuse = [&](const std::string& what, const std::string& then, const std::string& now) {
    return Status::Invalid(cannot + what + " changed since the run started (" + then + " then, " + now + " now); " + fresh);
  };
  if (m.value("config_hash", "") != id_.config_hash)
    return refuse("the experiment's configuration", m.value("config_hash", "?"), id_.config_hash);
  if (m.value("model_hash", "") != id_.model_hash)
    return refuse("the model's weights", m.value("model_hash", "?"), id_.model_hash);
  if (m.value("items", int64_t{-1}) != id_.items)
    return refuse("the dataset", std::to_string(m.value("items", int64_t{-1})) + " items",
                  std::to_string(id_.items) + " items");
  std::string then_plugins, now_plugins;
  for (const auto& pl : m.value("plugins", json::array()))
    then_plugins += (then_plugins.empty() ? "" : ", ") + pl.value("name", "?") + " " + pl.value("version", "?");
  for (const auto& pl : id_.plugins) now_plugins += (now_plugins.empty() ? "" : ", ") + pl.name + " " + pl.version;
  if (then_plugins != now_plugins) return refuse("the plugins", then_plugins, now_plugins);
  std::map<std::string, std::string> then_files;  // path -> hash
  for (const auto& f : m["files"]) then_files[f["path"].get<std::string>()] = f["hash"].get<std::string>();
  for (const RunIdentity::DataFile& f : id_.files) {
    auto it = then_files.find(as_recorded(f.path));
    if (it == then_files.end() || it->second != f.hash)
      return refuse("the file " + f.path + " (" + f.what + ")", it == then_files.end() ? "not recorded" : it->second, f.hash);
  }

  // The finished batches, each with what it was computed from.
  std::map<int64_t, std::string> then_content;
  for (const auto& d : m["done"]) then_content[d[0].get<int64_t>()] = d[1].get<std::string>();
  std::set<int64_t> changed;
  for (const auto& [k, c] : then_content) {
    if (hex64(hooks.content_now(k)) != c) {
      changed.insert(k);
      continue;
    }
    done_.insert(k);
    content_[k] = c;
  }
  const bool complete = m["state"] == "complete";
  // An unfinished run's shards, as the merge will read them: one that is cut short (a kill while
  // the disk did not keep what was written), garbage or gone is redone, not trusted.
  int64_t damaged = 0;
  for (auto it = done_.begin(); !complete && it != done_.end();) {
    const Status st = hooks.check_shard(*it);
    if (st.ok()) {
      ++it;
      continue;
    }
    std::fprintf(stderr, "run: resume: %s; redoing batch %lld\n", st.message().c_str(), static_cast<long long>(*it));
    content_.erase(*it);
    it = done_.erase(it);
    ++damaged;
  }
  resumed_ = static_cast<int64_t>(done_.size());
  redone_ = static_cast<int64_t>(changed.size()) + damaged;
  std::error_code ec;
  if (complete && changed.empty()) {  // nothing left to do: leave the run as it is
    complete_ = true;
    recorded_sequences_ = m["sequences"].get<int64_t>();
    recorded_failed_ = m["failed"].get<int64_t>();
    fs::remove_all(dir_ / "shards", ec);  // left by a resume that was killed while it cut the outputs (unmerge)
    return Status::Ok();
  }
  if (!changed.empty() && opt.progress)
    std::fprintf(stderr, "run: resume: %zu of %zu finished batches changed since they were written; redoing them\n",
                 changed.size(), then_content.size());
  if (complete) {
    fs::create_directories(dir_ / "shards", ec);
    if (ec) return Status::IoError(dir_.string() + ": cannot create " + (dir_ / "shards").string() + ": " + ec.message());
    TSR_RETURN_IF_ERROR(hooks.unmerge(done_).with_prefix(cannot.substr(0, cannot.size() - 2)));
  }
  return Status::Ok();
}

Status RunFolder::write_manifest(const std::string& state, int64_t sequences, int64_t failed) const {
  json plugins = json::array();
  for (const auto& p : id_.plugins) plugins.push_back({{"name", p.name}, {"version", p.version}, {"modality", p.modality}});
  json files = json::array();
  for (const auto& f : id_.files) files.push_back({{"what", f.what}, {"path", f.path}, {"hash", f.hash}});
  json done = json::array();
  for (int64_t k : done_) done.push_back(json::array({k, content_.at(k)}));
  json m = {{"format", kManifestFormat},
            {"experiment", id_.experiment},
            {"config_hash", id_.config_hash},
            {"model_hash", id_.model_hash},
            {"plugins", plugins},
            {"task", id_.task},
            {"items", id_.items},
            {"batch_size", id_.batch_size},
            {"batches", id_.batches},
            {"files", files},
            {"done", done},
            {"state", state}};
  if (state == "complete") {
    m["sequences"] = sequences;
    m["failed"] = failed;
  }
  // One key per line, each value on its line: rewritten after every batch, it grows by one short
  // pair per batch.
  std::string text = "{\n";
  for (auto it = m.begin(); it != m.end(); ++it)
    text += "  " + json(it.key()).dump() + ": " + it.value().dump(-1, ' ', false, json::error_handler_t::replace) +
            (std::next(it) == m.end() ? "\n" : ",\n");
  return write_file_atomic((dir_ / "manifest.json").string(), text + "}\n");
}

Status RunFolder::mark_done(int64_t k, uint64_t content) {
  done_.insert(k);
  content_[k] = hex64(content);
  return write_manifest("running");
}

Status RunFolder::finish(int64_t sequences, int64_t failed) {
  TSR_RETURN_IF_ERROR(write_manifest("complete", sequences, failed));
  std::error_code ec;
  fs::remove_all(dir_ / "shards", ec);
  return Status::Ok();
}

}  // namespace tessera::run
