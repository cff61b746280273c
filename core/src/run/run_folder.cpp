// The run folder: manifest, resume checks, the end of a run. See run_folder.h.
#include "run_folder.h"

#include <algorithm>
#include <fstream>

namespace tessera::run {

namespace fs = std::filesystem;

namespace {

// 2: each finished batch with the hash of its items' content, and the files the plugins read.
// (1: batch numbers only.)
constexpr int kManifestFormat = 2;

}  // namespace

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

Status RunFolder::open(const RunOptions& opt, const std::function<uint64_t(int64_t)>& content_now,
                       const std::function<Status(const std::set<int64_t>&)>& unmerge, bool with_attention) {
  std::error_code ec;
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
        resumed = check_resume(m, opt, content_now, unmerge);
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
Status RunFolder::check_resume(const json& m, const RunOptions& opt, const std::function<uint64_t(int64_t)>& content_now,
                               const std::function<Status(const std::set<int64_t>&)>& unmerge) {
  const std::string cannot = "cannot resume " + dir_.string() + ": ";
  const std::string fresh = "start over with --force, or run into another folder with --out";
  const int64_t format = m.value("format", int64_t{0});
  if (format < kManifestFormat)
    return Status::Invalid(cannot + "its manifest.json (format " + std::to_string(format) +
                           ") does not record what each finished batch was computed from, so a resume cannot tell "
                           "which of them are stale (it was written by an earlier tessera); " + fresh);
  if (format > kManifestFormat)
    return Status::Invalid(cannot + "its manifest.json has format " + std::to_string(format) + ", newer than this "
                           "tessera's (" + std::to_string(kManifestFormat) + "); resume it with the tessera that started "
                           "it, or " + fresh);
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
  for (const auto& f : m.value("files", json::array()))
    if (f.is_object()) then_files[f.value("path", "")] = f.value("hash", "");
  for (const RunIdentity::DataFile& f : id_.files) {
    auto it = then_files.find(f.path);
    if (it == then_files.end() || it->second != f.hash)
      return refuse("the file " + f.path + " (" + f.what + ")", it == then_files.end() ? "not recorded" : it->second, f.hash);
  }

  // The finished batches, each with what it was computed from.
  std::map<int64_t, std::string> then_content;
  for (const auto& d : m.value("done", json::array())) {
    const bool ok = d.is_array() && d.size() == 2 && d[0].is_number_integer() && d[1].is_string() &&
                    d[0].get<int64_t>() >= 0 && d[0].get<int64_t>() < id_.batches;
    if (!ok)
      return Status::Invalid(cannot + "its manifest.json lists a finished batch as " + d.dump() +
                             ", not [batch, content hash], so a resume cannot tell whether it is stale; " + fresh);
    then_content[d[0].get<int64_t>()] = d[1].get<std::string>();
  }
  std::set<int64_t> changed;
  for (const auto& [k, c] : then_content) {
    if (hex64(content_now(k)) != c) {
      changed.insert(k);
      continue;
    }
    done_.insert(k);
    content_[k] = c;
  }
  const bool complete = m.value("state", "") == "complete";
  resumed_ = static_cast<int64_t>(done_.size());
  redone_ = static_cast<int64_t>(changed.size());
  std::error_code ec;
  if (complete && changed.empty()) {  // nothing left to do: leave the run as it is
    complete_ = true;
    recorded_sequences_ = m.value("sequences", int64_t{0});
    recorded_failed_ = m.value("failed", int64_t{0});
    fs::remove_all(dir_ / "shards", ec);  // left by a resume that was killed while it cut the outputs (unmerge)
    return Status::Ok();
  }
  if (!changed.empty() && opt.progress)
    std::fprintf(stderr, "run: resume: %zu of %zu finished batches changed since they were written; redoing them\n",
                 changed.size(), then_content.size());
  if (complete) {
    fs::create_directories(dir_ / "shards", ec);
    if (ec) return Status::IoError(dir_.string() + ": cannot create " + (dir_ / "shards").string() + ": " + ec.message());
    TSR_RETURN_IF_ERROR(unmerge(done_).with_prefix(cannot.substr(0, cannot.size() - 2)));
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
