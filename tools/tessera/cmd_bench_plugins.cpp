// `tessera bench --plugins`: time the modality plugins' front ends on real files. Each built-in
// plugin is found and loaded through the same loader and C ABI a third-party plugin uses
// (find_plugin, Plugin::load, Encoder), given a recipe's options, and run over its input: one
// untimed pass that checks every item and measures it, more warm-up passes, then the median of N
// timed passes and their spread (a warning when it is wide, bench_machine.h). One thread. Rates
// come in each modality's own unit: images/s, seconds of audio per second, MB/s (10^6 bytes) of
// FASTA or text. Files are read into memory before timing.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "bench_machine.h"
#include "bench_plugins.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/plugins.h"
#include "tessera/run.h"

namespace tessera::cli {

namespace fs = std::filesystem;

std::string default_bench_data_dir() {
  std::error_code ec;
  const fs::path exe = fs::weakly_canonical(fs::read_symlink("/proc/self/exe", ec), ec);
  const fs::path tree = fs::weakly_canonical(TESSERA_BUILD_DIR, ec);
  const bool in_tree = !exe.empty() && !tree.empty() &&
                       std::mismatch(tree.begin(), tree.end(), exe.begin(), exe.end()).first == tree.end();
  // The tool in its build tree reads the sources' files; an installed one, the copies installed
  // with it (<prefix>/share/tessera/bench-data), wherever the prefix went.
  if (in_tree || exe.empty()) return std::string(TESSERA_SOURCE_DIR) + "/tests/data";
  return (exe.parent_path() / TESSERA_BENCH_DATA_FROM_BIN).lexically_normal().string();
}

namespace {

// The files the cases read, by role; --input ROLE=PATH replaces the default (under --data).
struct Role {
  const char* name;
  const char* default_path;  // relative to --data
  const char* what;
};
constexpr Role kRoles[] = {
    {"image", "image/chelsea.jpg", "an image file or a folder of them"},
    {"audio", "audio/librivox_0880.wav", "a sound file or a folder of them"},
    {"protein", "protein/uniprot_sample.fasta", "a FASTA file"},
    {"text", "text/corpus.txt", "a text file, one item per line"},
    {"gpt2-vocab", "text/encoder.json", "GPT-2's encoder.json"},
    {"gpt2-merges", "text/vocab.bpe", "GPT-2's vocab.bpe"},
    {"bert-vocab", "text/vocab.txt", "BERT's (uncased) vocab.txt"},
};

enum class Unit { images, audio_seconds, megabytes };

struct Case {
  std::string name, plugin, recipe;
  std::string input;  // the role of the items
  DataFormat format;  // how a text input splits into items (fasta, lines); dir for files
  std::vector<std::pair<std::string, std::string>> options;  // a value "@role" is that role's file
  Unit unit;
};

std::vector<Case> all_cases() {
  return {
      {"image/vit224",
       "image",
       "ViTImageProcessor: decode, resize to 224x224 (PIL bilinear), rescale, normalise, 196 16x16 patches + "
       "CLS",
       "image",
       DataFormat::dir,
       {},
       Unit::images},
      {"audio/whisper",
       "audio",
       "Whisper log-mel: 16 kHz, 80 bands, padded to 30 s (3000 frames)",
       "audio",
       DataFormat::dir,
       {{"recipe", "whisper"}},
       Unit::audio_seconds},
      {"audio/ast",
       "audio",
       "AST Kaldi fbank: 16 kHz, 128 bands, 1024 frames, normalised",
       "audio",
       DataFormat::dir,
       {{"recipe", "ast"}},
       Unit::audio_seconds},
      {"protein/esm2",
       "protein",
       "ESM-2 tokens, one item per FASTA record, whole sequences",
       "protein",
       DataFormat::fasta,
       {{"max_length", "1000000"}},
       Unit::megabytes},
      {"text/bpe",
       "text",
       "GPT-2 byte-level BPE, one item per line",
       "text",
       DataFormat::lines,
       {{"tokenizer", "bpe"}, {"vocab", "@gpt2-vocab"}, {"merges", "@gpt2-merges"}},
       Unit::megabytes},
      {"text/wordpiece",
       "text",
       "BERT WordPiece (uncased, [CLS] ... [SEP]), one item per line",
       "text",
       DataFormat::lines,
       {{"tokenizer", "wordpiece"}, {"vocab", "@bert-vocab"}},
       Unit::megabytes},
      {"text/bytes",
       "text",
       "bytes, one id per byte, one item per line",
       "text",
       DataFormat::lines,
       {{"tokenizer", "bytes"}},
       Unit::megabytes},
  };
}

const char* unit_name(Unit u) {
  switch (u) {
    case Unit::images:
      return "images/s";
    case Unit::audio_seconds:
      return "s of audio/s";
    default:
      return "MB/s";
  }
}

// About three significant digits: 47,193, 237, 45.2, 8.91.
std::string sig3(double v) {
  return v >= 1000 ? fmt_count(std::round(v)) : fmt(v, v >= 100 ? 0 : v >= 10 ? 1 : 2, false);
}

// The items of one input: their bytes stay in `storage` for the whole bench.
struct Items {
  std::vector<std::string> storage;
  std::vector<PluginItem> items;
  std::vector<std::string> files;
  double bytes = 0;
};

Result<Items> read_items(const Case& c, const std::vector<std::string>& paths, const Plugin& plugin) {
  Items out;
  PluginInput pi{plugin.name(), plugin.input_kind(), plugin.extensions()};
  for (const std::string& path : paths) {
    std::error_code ec;
    if (plugin.input_kind() == TSR_INPUT_FILE) {
      std::vector<std::string> files{path};
      if (fs::is_directory(path, ec)) {
        DataConfig data;
        data.path = path;
        data.format = DataFormat::dir;
        TSR_ASSIGN_OR_RETURN(std::vector<DataItem> listed, read_dataset(data, {pi}));
        files.clear();
        for (const DataItem& it : listed) files.push_back(it.parts[0].path);
      }
      for (const std::string& f : files) {
        TSR_ASSIGN_OR_RETURN(std::string bytes, read_file(f));
        out.storage.push_back(std::move(bytes));
        out.files.push_back(f);
      }
    } else {
      DataConfig data;
      data.path = path;
      data.format = c.format;
      TSR_ASSIGN_OR_RETURN(std::vector<DataItem> listed, read_dataset(data, {pi}));
      TSR_ASSIGN_OR_RETURN(std::string text, read_file(path));
      for (const DataItem& it : listed) {
        if (!it.error.empty()) return Status::Invalid(it.error);
        out.storage.push_back(text.substr(it.parts[0].offset, it.parts[0].length));
      }
      out.files.push_back(path);
      for (const DataItem& it : listed) {
        PluginItem item;
        item.id = it.id;
        item.source = path;
        item.source_offset = it.parts[0].offset;
        item.source_line = it.parts[0].line;
        out.items.push_back(item);
      }
    }
  }
  // Views into storage only now: the vector no longer moves.
  if (plugin.input_kind() == TSR_INPUT_FILE) {
    for (size_t i = 0; i < out.storage.size(); ++i) {
      PluginItem item;
      item.id = fs::path(out.files[i]).filename().string();
      item.source = out.files[i];
      out.items.push_back(item);
    }
  }
  for (size_t i = 0; i < out.items.size(); ++i) {
    out.items[i].data = out.storage[i];
    out.bytes += static_cast<double>(out.storage[i].size());
  }
  if (out.items.empty()) return Status::NotFound("no items in " + paths[0]);
  return out;
}

// All of the plugin's options as text: the case's, else the plugin's defaults (as the config
// loader does); "@role" becomes that role's file, made absolute.
Result<std::vector<std::pair<std::string, std::string>>> options_for(
    const Case& c, const Plugin& plugin, const std::map<std::string, std::string>& files) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const PluginOptionSpec& o : plugin.options()) {
    auto given =
        std::find_if(c.options.begin(), c.options.end(), [&](const auto& kv) { return kv.first == o.name; });
    if (given != c.options.end()) {
      std::string v = given->second;
      if (!v.empty() && v[0] == '@') v = fs::absolute(files.at(v.substr(1))).string();
      out.emplace_back(o.name, v);
    } else if (o.default_value) {
      out.emplace_back(o.name, *o.default_value);
    } else {
      return Status::Invalid("plugin " + plugin.name() + " (" + plugin.file() + ") requires option " +
                             o.name + ", which this bench does not know how to set");
    }
  }
  for (const auto& [name, value] : c.options)
    if (std::none_of(out.begin(), out.end(), [&](const auto& kv) { return kv.first == name; }))
      return Status::Invalid("plugin " + plugin.name() + " (" + plugin.file() + ", version " +
                             plugin.version() + ") has no option " + name + " (an older plugin?)");
  return out;
}

struct Figures {
  std::string input;  // for the table: "chelsea.jpg: 1 JPEG, 451x300"
  int64_t items = 0, rows = 0;
  double units = 0;  // per pass, in the case's unit (seconds of audio, MB, images)
  std::vector<double> times;
  std::string plugin_file, plugin_version;
  std::vector<std::pair<std::string, std::string>> options;
  std::vector<std::string> files;
};

std::string image_format(std::string_view b) {
  if (b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF && static_cast<uint8_t>(b[1]) == 0xD8)
    return "JPEG";
  if (b.size() >= 8 && b.substr(1, 3) == "PNG") return "PNG";
  return "image";
}

Result<Figures> run_case(const Case& c, const std::map<std::string, std::string>& files, int reps,
                         int warmup) {
  Figures f;
  TSR_ASSIGN_OR_RETURN(std::string file, find_plugin(c.plugin, {}));
  TSR_ASSIGN_OR_RETURN(std::shared_ptr<const Plugin> plugin, Plugin::load(file));
  f.plugin_file = plugin->file();
  f.plugin_version = plugin->version();
  TSR_ASSIGN_OR_RETURN(f.options, options_for(c, *plugin, files));
  TSR_ASSIGN_OR_RETURN(Encoder enc, Encoder::create(plugin, f.options));
  const std::string input_path = files.at(c.input);
  TSR_ASSIGN_OR_RETURN(Items in, read_items(c, {input_path}, *plugin));
  f.items = static_cast<int64_t>(in.items.size());
  f.files = in.files;

  // The first pass checks every item and measures it: rows, and the seconds of audio (the
  // spectrogram picture covers [0, duration), padding left out).
  double audio_seconds = 0;
  int width = 0, height = 0;
  for (const PluginItem& item : in.items) {
    TSR_ASSIGN_OR_RETURN(std::vector<TokenRows> seqs, enc.encode(item));
    for (const TokenRows& s : seqs) {
      f.rows += s.size();
      if (c.unit == Unit::audio_seconds) {
        if (s.picture.width == 0)
          return Status::Internal(item.id + ": the audio plugin gave no picture, so its duration is unknown");
        audio_seconds += s.picture.x1 - s.picture.x0;
      }
      if (width == 0) width = static_cast<int>(s.picture.x1), height = static_cast<int>(s.picture.y1);
    }
  }
  switch (c.unit) {
    case Unit::images:
      f.units = static_cast<double>(f.items);
      break;
    case Unit::audio_seconds:
      f.units = audio_seconds;
      break;
    case Unit::megabytes:
      f.units = in.bytes * 1e-6;
      break;
  }
  const std::string base = fs::path(input_path).filename().string();
  if (c.unit == Unit::images) {
    f.input = base + ": " +
              (f.items == 1 ? "1 " + image_format(in.storage[0]) + ", " + std::to_string(width) + "x" +
                                  std::to_string(height)
                            : std::to_string(f.items) + " files");
  } else if (c.unit == Unit::audio_seconds) {
    f.input = base + ": " + std::to_string(f.items) + " file" + (f.items == 1 ? "" : "s") + ", " +
              fmt(audio_seconds, 2, false) + " s";
  } else {
    f.input = base + ": " + fmt_count(static_cast<double>(f.items)) +
              (c.format == DataFormat::fasta ? " records, " : " lines, ") + fmt(in.bytes * 1e-6, 2, false) +
              " MB";
  }

  for (int i = 1; i < warmup + reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const PluginItem& item : in.items) {
      Result<std::vector<TokenRows>> r = enc.encode(item);
      if (!r.ok()) return r.status();
    }
    if (i >= warmup) f.times.push_back(seconds_since(t0));
  }
  return f;
}

}  // namespace

int run_plugin_bench(const PluginBenchArgs& a) {
  const char* me = "tessera bench --plugins";
  if (a.reps < 1 || a.warmup < 1) {
    std::fprintf(
        stderr,
        "%s: --reps and --warmup must be at least 1 (the first warm-up pass also checks every item)\n", me);
    return kExitBadInput;
  }
  // Which cases.
  const std::vector<Case> cases = all_cases();
  std::vector<const Case*> chosen;
  for (const Case& c : cases)
    if (a.only.empty() || std::any_of(a.only.begin(), a.only.end(),
                                      [&](const std::string& o) { return o == c.name || o == c.plugin; }))
      chosen.push_back(&c);
  for (const std::string& o : a.only)
    if (std::none_of(cases.begin(), cases.end(),
                     [&](const Case& c) { return o == c.name || o == c.plugin; })) {
      std::string list;
      for (const Case& c : cases) list += (list.empty() ? "" : ", ") + c.name;
      std::fprintf(stderr, "%s: --only %s: no such case or plugin (cases: %s)\n", me, o.c_str(),
                   list.c_str());
      return kExitBadInput;
    }
  // Which files: --input, else the defaults under --data.
  std::map<std::string, std::string> files, given;
  for (const std::string& in : a.inputs) {
    const size_t eq = in.find('=');
    const std::string role = in.substr(0, eq);
    if (eq == std::string::npos || eq + 1 == in.size() ||
        std::none_of(std::begin(kRoles), std::end(kRoles), [&](const Role& r) { return role == r.name; })) {
      std::string list;
      for (const Role& r : kRoles) list += std::string(list.empty() ? "" : ", ") + r.name;
      std::fprintf(stderr, "%s: --input %s: expected ROLE=PATH with ROLE one of %s\n", me, in.c_str(),
                   list.c_str());
      return kExitBadInput;
    }
    if (!given.emplace(role, in.substr(eq + 1)).second) {
      std::fprintf(stderr, "%s: --input %s: %s is given twice (a folder of files can be one input)\n", me,
                   in.c_str(), role.c_str());
      return kExitBadInput;
    }
  }
  int missing = 0;
  for (const Case* c : chosen) {
    std::vector<std::string> roles{c->input};
    for (const auto& [name, value] : c->options)
      if (!value.empty() && value[0] == '@') roles.push_back(value.substr(1));
    for (const std::string& role : roles) {
      if (files.count(role)) continue;
      const Role& r =
          *std::find_if(std::begin(kRoles), std::end(kRoles), [&](const Role& x) { return role == x.name; });
      const bool is_given = given.count(role) > 0;
      const std::string path = is_given ? given[role] : (fs::path(a.data_dir) / r.default_path).string();
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        if (is_given)
          std::fprintf(stderr, "%s: %s: --input %s=%s: no such file or directory\n", me, c->name.c_str(),
                       role.c_str(), path.c_str());
        else
          std::fprintf(
              stderr,
              "%s: %s: its default input %s (%s) is missing; pass --input %s=PATH, or --data DIR with "
              "the layout of the sources' tests/data, or leave the case out with --only\n",
              me, c->name.c_str(), path.c_str(), r.what, role.c_str());
        ++missing;
        files[role] = "";
        continue;
      }
      files[role] = path;
    }
  }
  if (missing > 0) return kExitBadInput;

  std::vector<std::vector<std::string>> rows{
      {"case", "input", "per pass", "items/s", "rows/s", "rate", "spread"}};
  nlohmann::json jcases = nlohmann::json::array();
  std::vector<std::string> warnings;  // cases whose passes spread more than kSpreadLimit
  for (const Case* c : chosen) {
    Result<Figures> r = run_case(*c, files, a.reps, a.warmup);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s: %s\n", me, c->name.c_str(), r.status().message().c_str());
      return r.status().code() == Code::internal ? kExitFailure : kExitBadInput;
    }
    const Figures& f = *r;
    const Spread spread = spread_of(f.times);
    const double med = spread.median;
    const double rate = f.units / med;
    rows.push_back({c->name, f.input, fmt(med * 1e3, 2, false) + " ms",
                    sig3(static_cast<double>(f.items) / med),
                    fmt_count(std::round(static_cast<double>(f.rows) / med)),
                    sig3(rate) + " " + unit_name(c->unit), spread_ratio(spread)});
    if (std::string w = spread_warning(c->name, spread); !w.empty()) warnings.push_back(std::move(w));
    nlohmann::json opts = nlohmann::json::object();
    for (const auto& [k, v] : f.options) opts[k] = v;
    const nlohmann::json jc = {{"case", c->name},
                               {"plugin", c->plugin},
                               {"plugin_file", f.plugin_file},
                               {"plugin_version", f.plugin_version},
                               {"recipe", c->recipe},
                               {"options", opts},
                               {"files", f.files},
                               {"input", f.input},
                               {"items_per_pass", f.items},
                               {"rows_per_pass", f.rows},
                               {"units_per_pass", f.units},
                               {"unit", unit_name(c->unit)},
                               {"median_s", med},
                               {"spread", spread.ratio()},
                               {"times_s", f.times},
                               {"items_per_s", static_cast<double>(f.items) / med},
                               {"rows_per_s", static_cast<double>(f.rows) / med},
                               {"rate", rate}};
    jcases.push_back(jc);
  }
  std::printf(
      "# plugin front ends, 1 thread: median of %d passes over each input after %d warm-up, and their spread "
      "(slowest / fastest); files are read into memory first\n",
      a.reps, a.warmup);
  std::printf("%s", table(rows, 0).c_str());
  for (const std::string& w : warnings) std::printf("%s\n", w.c_str());
  std::printf("\n# recipes\n");
  std::vector<std::vector<std::string>> recipes;
  for (const Case* c : chosen) recipes.push_back({c->name, c->recipe});
  std::printf("%s", table(recipes, 0).c_str());
  if (!a.json.empty()) {
    const nlohmann::json j = {{"threads", 1},
                              {"reps", a.reps},
                              {"warmup", a.warmup},
                              {"cases", jcases},
                              {"spread_limit", kSpreadLimit},
                              {"warnings", warnings}};
    if (Status st = write_file_atomic(a.json, j.dump(2) + "\n"); !st.ok()) {
      std::fprintf(stderr, "%s: %s\n", me, st.message().c_str());
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace tessera::cli
