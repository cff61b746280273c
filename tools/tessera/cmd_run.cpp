// `tessera run` (an experiment over its dataset), `tessera plugins` (what the plugin search finds)
// and `tessera tokenize` (one input, or each record of a FASTA file, through an experiment's
// plugin, row by row). The batch runner itself is core's (tessera/run.h); this file parses options
// and prints.
#include <CLI/CLI.hpp>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "commands.h"
#include "tessera/comm.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/run.h"

namespace tessera::cli {

namespace {

constexpr int kExitSomeItemsFailed = 3;

// SIGTERM and SIGINT stop a run after the batch it is writing (RunOptions::stop); a second one
// ends the process at once (the handler resets itself), which the run folder also survives: its
// files are written atomically and a resume redoes what is not recorded as done.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "set from a signal handler");

extern "C" void on_stop_signal(int signal) { g_stop_signal.store(signal); }

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

struct RunArgs {
  std::string file, out;
  std::vector<std::string> overrides;
  bool resume = false, force = false, quiet = false;
  int64_t limit = -1, batch_size = 0;
  int threads = -1, workers = -1;
};

// The run folder's files and folders with their sizes. Whatever else is there (a dangling
// symbolic link, a link loop, a file removed meanwhile) is listed as it is, never an error.
std::vector<std::vector<std::string>> folder_listing(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::vector<std::string>> rows;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const fs::path& p = it->path();
    std::error_code e2;
    if (it->is_directory(e2)) {
      int64_t n = 0;
      for (auto f = fs::directory_iterator(p, e2); !e2 && f != fs::directory_iterator(); f.increment(e2)) ++n;
      rows.push_back({p.string() + "/", std::to_string(n) + " files"});
      continue;
    }
    const uintmax_t size = it->file_size(e2);
    if (!e2) rows.push_back({p.string(), fmt_bytes(static_cast<double>(size))});
    else if (it->is_symlink(e2)) rows.push_back({p.string(), "(a link to nothing readable)"});
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

int run_run(const RunArgs& a) {
  std::vector<std::string> overrides = a.overrides;
  if (a.limit >= 0) overrides.push_back("data.limit=" + std::to_string(a.limit));
  if (a.batch_size > 0) overrides.push_back("runtime.batch_size=" + std::to_string(a.batch_size));
  if (a.threads >= 0) overrides.push_back("runtime.threads=" + std::to_string(a.threads));
  if (a.workers >= 0) overrides.push_back("runtime.workers=" + std::to_string(a.workers));
  std::optional<Experiment> exp = load(a.file, overrides);
  if (!exp) return kExitBadInput;
  RunOptions opt;
  opt.out_dir = a.out;
  opt.resume = a.resume;
  opt.force = a.force;
  opt.progress = !a.quiet;
  opt.stop = &g_stop_signal;
  catch_stop_signals();
  Result<RunSummary> r = run_experiment(*exp, opt);
  // Under MPI, rank 0 speaks for the job; another rank prints only its own failure.
  const bool speaks = Comm::world().rank() == 0;
  if (!r.ok()) {
    if (r.status().message().empty()) return r.status().code() == Code::internal || r.status().code() == Code::io_error
                                                 ? kExitFailure
                                                 : kExitBadInput;  // rank 0 said why
    std::fprintf(stderr, "tessera run: %s\n", r.status().message().c_str());
    const Code c = r.status().code();
    if (c == Code::io_error)  // a full disk, a read-only folder: the batches written stay written
      std::fprintf(stderr, "tessera run: the batches finished before this are kept; once the run folder can be "
                           "written (free space, write permission), continue with --resume\n");
    return c == Code::internal || c == Code::io_error ? kExitFailure : kExitBadInput;
  }
  const RunSummary& s = *r;
  if (!speaks) return s.stopped_by != 0 ? 128 + s.stopped_by : s.failed > 0 ? kExitSomeItemsFailed : kExitOk;
  if (s.stopped_by != 0) {  // exit 128 + the signal, as the shell reports a process it ended
    std::fprintf(stderr, "tessera run: stopped by %s: %lld of %lld batches kept in %s; continue with --resume\n",
                 s.stopped_by == SIGINT ? "SIGINT" : s.stopped_by == SIGTERM ? "SIGTERM" : strsignal(s.stopped_by),
                 static_cast<long long>(s.batches_kept), static_cast<long long>(s.batches), s.dir.c_str());
    return 128 + s.stopped_by;
  }
  const std::string redone = s.batches_redone > 0 ? ", " + std::to_string(s.batches_redone) + " redone" : "";
  std::printf("%s: %lld items, %lld sequences written, %lld failed, %lld batches (%lld resumed%s), %.1f s\n",
              s.dir.c_str(), static_cast<long long>(s.items), static_cast<long long>(s.sequences),
              static_cast<long long>(s.failed), static_cast<long long>(s.batches),
              static_cast<long long>(s.batches_resumed), redone.c_str(), s.seconds);
  if (s.seconds > 0) {  // where the time went; "waiting for the plugins": decoding the model did not hide
    std::printf("  time: setup %.1f s, model %.1f s, waiting for the plugins %.1f s, outputs %.1f s", s.setup_seconds,
                s.model_seconds, s.wait_seconds,
                std::max(0.0, s.seconds - s.setup_seconds - s.model_seconds - s.wait_seconds));
    if (s.batches_resumed == 0 && s.items > 0) std::printf("; %.2f items/s", static_cast<double>(s.items) / s.seconds);
    std::printf("\n");
  }
  std::printf("%s", table(folder_listing(s.dir), 2).c_str());
  if (s.failed > 0)
    std::fprintf(stderr, "tessera run: %lld item(s) failed; their reasons are in %s/errors.jsonl\n",
                 static_cast<long long>(s.failed), s.dir.c_str());
  return s.failed > 0 ? kExitSomeItemsFailed : kExitOk;
}

struct PluginsArgs {
  std::vector<std::string> dirs;
  bool options = false;
};

int run_plugins(const PluginsArgs& a) {
  std::vector<std::string> dirs = a.dirs;
  for (const std::string& d : plugin_search_dirs()) dirs.push_back(d);
  const PluginScan scan = scan_plugins(dirs);
  std::printf("# searched, in order: ");
  for (size_t i = 0; i < dirs.size(); ++i) std::printf("%s%s", i ? ", " : "", dirs[i].c_str());
  std::printf("\n");
  std::vector<std::vector<std::string>> rows{{"name", "modality", "version", "file"}};
  for (const auto& f : scan.found) rows.push_back({f.name, f.modality, f.version, f.file});
  std::printf("%s", table(rows, 0).c_str());
  if (a.options)
    for (const auto& f : scan.found) {
      Result<std::shared_ptr<const Plugin>> p = Plugin::load(f.file);
      if (!p.ok()) continue;
      std::printf("\n# %s: %s\n", f.name.c_str(), (*p)->description().c_str());
      std::vector<std::vector<std::string>> opts{{"option", "type", "default", "meaning"}};
      for (const PluginOptionSpec& o : (*p)->options()) {
        std::string type = option_type_name(o.type);
        if (o.type == TSR_OPT_ENUM) {
          type = "";
          for (const auto& c : o.choices) type += (type.empty() ? "" : " | ") + c;
        }
        opts.push_back({o.name, type, o.default_value ? *o.default_value : "required", o.meaning});
      }
      std::printf("%s", table(opts, 2).c_str());
    }
  if (!scan.refused.empty()) {
    std::printf("\n# refused\n");
    rows = {{"file", "reason"}};
    for (const auto& r : scan.refused) rows.push_back({r.file, r.reason});
    std::printf("%s", table(rows, 0).c_str());
  }
  return kExitOk;
}

// A FASTA file: its first non-blank character (after a UTF-8 byte-order mark) is a '>' header.
bool is_fasta(const std::string& bytes) {
  size_t i = bytes.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  while (i < bytes.size() && std::isspace(static_cast<unsigned char>(bytes[i]))) ++i;
  return i < bytes.size() && bytes[i] == '>';
}

// An input's rows, one table per sequence: id or features, role, position, provenance.
void print_rows(const std::string& shown, const std::vector<TokenRows>& sequences, const Encoder& enc) {
  static const char* roles[] = {"content", "cls", "eos", "pad", "mask", "sep", "bos", "unk"};
  for (const TokenRows& r : sequences) {
    std::printf("# %s%s: %lld rows of %s%s\n", shown.c_str(), r.label.empty() ? "" : ("/" + r.label).c_str(),
                static_cast<long long>(r.size()),
                r.kind == TSR_ROWS_IDS ? "token ids"
                                       : ("features, " + std::to_string(r.features.dim(1)) + " wide").c_str(),
                r.grid_rows
                    ? (", grid " + std::to_string(r.grid_rows) + " x " + std::to_string(r.grid_cols)).c_str()
                    : "");
    std::vector<std::vector<std::string>> t{{"row", r.kind == TSR_ROWS_IDS ? "id" : "mean", "role", "position", "provenance"}};
    for (int64_t i = 0; i < r.size(); ++i) {
      const size_t u = static_cast<size_t>(i);
      std::string v;
      if (r.kind == TSR_ROWS_IDS) {
        v = std::to_string(r.ids[u]);
        Result<std::string> piece = enc.decode({r.ids[u]});
        if (piece.ok()) v += "  \"" + *piece + "\"";
      } else {
        double m = 0;
        for (int64_t f = 0; f < r.features.dim(1); ++f) m += r.features.at({i, f});
        v = fmt(m / static_cast<double>(r.features.dim(1)), 4, false);
      }
      const tsr_provenance& pv = r.provenance[u];
      std::string prov;
      switch (pv.kind) {
        case TSR_PROV_BYTES: prov = "bytes [" + fmt(pv.x0, 0, false) + ", " + fmt(pv.x1, 0, false) + ")"; break;
        case TSR_PROV_PIXELS:
          prov = "pixels x [" + fmt(pv.x0, 1, false) + ", " + fmt(pv.x1, 1, false) + ") y [" + fmt(pv.y0, 1, false) + ", " +
                 fmt(pv.y1, 1, false) + ")";
          break;
        case TSR_PROV_TIME_FREQ:
          prov = "seconds [" + fmt(pv.x0, 3, false) + ", " + fmt(pv.x1, 3, false) + ") mel [" + fmt(pv.y0, 0, false) + ", " +
                 fmt(pv.y1, 0, false) + ")";
          break;
        case TSR_PROV_RESIDUE: prov = "residue " + fmt(pv.x0, 0, false); break;
        default: prov = "-";
      }
      const auto& pos = r.positions[u];
      t.push_back({std::to_string(i), v, r.roles[u] < 8 ? roles[r.roles[u]] : "?",
                   pos[1] < 0 ? std::to_string(pos[0]) : "(" + std::to_string(pos[0]) + ", " + std::to_string(pos[1]) + ")",
                   prov});
    }
    std::printf("%s", table(t, 0).c_str());
    if (r.kind == TSR_ROWS_IDS) {
      Result<std::string> text = enc.decode(r.ids);
      if (text.ok()) std::printf("decoded: %s\n", text->c_str());
    }
  }
}

struct TokenizeArgs {
  std::string file, text, input;
  std::vector<std::string> overrides;
  int plugin = 0;
};

int run_tokenize(const TokenizeArgs& a) {
  std::optional<Experiment> exp = load(a.file, a.overrides);
  if (!exp) return kExitBadInput;
  if (a.plugin < 0 || a.plugin >= static_cast<int>(exp->plugins.size())) {
    std::fprintf(stderr, "tessera tokenize: the experiment has %zu plugin(s); --plugin %d does not exist\n",
                 exp->plugins.size(), a.plugin);
    return kExitBadInput;
  }
  const PluginConfig& pc = exp->plugins[static_cast<size_t>(a.plugin)];
  Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
  if (!p.ok()) {
    std::fprintf(stderr, "tessera tokenize: %s\n", p.status().message().c_str());
    return kExitBadInput;
  }
  Result<Encoder> enc = Encoder::create(*p, pc.options);
  if (!enc.ok()) {
    std::fprintf(stderr, "tessera tokenize: %s\n", enc.status().message().c_str());
    return kExitBadInput;
  }
  // The inputs: --text, or --input FILE whole; a FASTA file for a plugin that reads text is split
  // into its records, as `tessera run` reads a FASTA dataset (splitting files is the host's job:
  // a plugin sees one record at a time).
  struct Input {
    PluginItem item;
    std::string shown;  // "<text>", the file, or "two.fasta#2 (name)"
    std::string error;  // non-empty: the record is broken before the plugin sees it
  };
  std::vector<Input> inputs;
  std::string bytes;  // the file's: the items' data are views of it
  if (a.input.empty()) {
    PluginItem item;
    item.id = "<text>";
    item.data = a.text;
    inputs.push_back({item, item.id, ""});
  } else {
    Result<std::string> r = read_file(a.input);
    if (!r.ok()) {
      std::fprintf(stderr, "tessera tokenize: %s\n", r.status().message().c_str());
      return kExitBadInput;
    }
    bytes = std::move(r).value();
    const bool text = (*p)->input_kind() == TSR_INPUT_TEXT;
    if (text && is_fasta(bytes)) {
      DataConfig data;
      data.path = a.input;
      data.format = DataFormat::fasta;
      Result<std::vector<DataItem>> records =
          read_dataset(data, {{(*p)->name(), TSR_INPUT_TEXT, (*p)->extensions()}});
      if (!records.ok()) {
        std::fprintf(stderr, "tessera tokenize: %s\n", records.status().message().c_str());
        return kExitBadInput;
      }
      for (const DataItem& d : *records) {
        const std::string shown = d.id + (d.name.empty() ? "" : " (" + d.name + ")");
        if (!d.error.empty() || d.parts.empty() || d.parts[0].offset + d.parts[0].length > bytes.size()) {
          // A record the reader refused (a header after blanks, say), or a file that changed since.
          inputs.push_back({PluginItem{}, shown, d.error.empty() ? "the file changed while it was read" : d.error});
          continue;
        }
        const ItemPart& part = d.parts[0];
        PluginItem item;
        item.id = d.id;
        item.source = a.input;
        item.source_offset = part.offset;
        item.source_line = part.line;
        item.data = std::string_view(bytes).substr(part.offset, part.length);
        inputs.push_back({item, shown, ""});
      }
    } else {
      PluginItem item;
      item.id = a.input;
      item.source = a.input;
      item.source_line = text ? 1 : 0;
      item.data = bytes;
      inputs.push_back({item, a.input, ""});
    }
  }
  int failed = 0;
  for (const Input& in : inputs) {
    if (!in.error.empty()) {
      std::fprintf(stderr, "tessera tokenize: %s: %s\n", in.shown.c_str(), in.error.c_str());
      ++failed;
      continue;
    }
    Result<std::vector<TokenRows>> rows = enc->encode(in.item);
    if (!rows.ok()) {
      std::fprintf(stderr, "tessera tokenize: %s: %s\n", in.shown.c_str(), rows.status().message().c_str());
      ++failed;
      continue;
    }
    print_rows(in.shown, *rows, *enc);
  }
  return failed > 0 ? kExitBadInput : kExitOk;
}

}  // namespace

void add_run_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Run an experiment over its dataset; write outputs to a run folder");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--out", args->out, "the run folder (default: outputs.dir, else runs/<experiment name>)");
  cmd->add_flag("--resume", args->resume, "continue a killed run in the run folder");
  cmd->add_flag("--force", args->force, "start over in a run folder that already holds a run");
  cmd->add_option("--limit", args->limit, "read at most this many items")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch-size", args->batch_size, "items per forward pass (default: runtime.batch_size)")
      ->check(CLI::Range(int64_t{1}, limits::kBatch));
  cmd->add_option("--threads", args->threads, "intra-op threads (default: runtime.threads; 0 = all cores)")
      ->check(CLI::Range(0, static_cast<int>(limits::kThreads)));
  cmd->add_option("--workers", args->workers, "threads decoding items while the model runs (default: runtime.workers)")
      ->check(CLI::Range(0, static_cast<int>(limits::kThreads)));
  cmd->add_flag("--quiet", args->quiet, "no progress on stderr");
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->footer("Exit codes: 0 all items done, 3 some items failed (see errors.jsonl), 2 bad input, 1 failure, "
              "143 / 130 stopped by SIGTERM / SIGINT after the batch it was writing (continue with --resume).");
  cmd->callback([args, run] { *run = [args] { return run_run(*args); }; });
}

void add_plugins_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<PluginsArgs>();
  CLI::App* cmd = app.add_subcommand("plugins", "List the plugins the search path finds, and those it refused");
  cmd->add_option("--dir", args->dirs, "also search this folder first (repeatable)");
  cmd->add_flag("--options", args->options, "list each plugin's options");
  cmd->callback([args, run] { *run = [args] { return run_plugins(*args); }; });
}

void add_tokenize_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Turn one input into token rows with an experiment's plugin; print them");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  auto* text = cmd->add_option("--text", args->text, "the input as text");
  cmd->add_option(
         "--input", args->input,
         "the input as a file; a FASTA file for a text plugin: each record, as `tessera run` reads it")
      ->excludes(text);
  cmd->add_option("--plugin", args->plugin, "which of the experiment's plugins (from 0)")->capture_default_str();
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_tokenize(*args); }; });
}

}  // namespace tessera::cli
