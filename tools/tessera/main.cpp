// `tessera`: the command line. Subcommands live in cmd_*.cpp; this file dispatches, and turns usage
// mistakes (a mistyped subcommand or option, an extra argument) into one line naming the nearest
// valid name. Results go to stdout, logs and errors to stderr; exit codes: 0 ok, 1 failure, 2 bad
// input (usage errors included). Bare `tessera` prints the help, with examples, and exits 0.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "commands.h"
#include "common.h"
#include "tessera/comm.h"
#include "tessera/config.h"
#include "tessera/ops.h"

namespace tessera::cli {

namespace {

constexpr const char* kExamples =
    "Examples:\n"
    "  tessera check configs/examples/red_ball_rolls.yaml          validate, print the resolved config and "
    "plan\n"
    "  tessera explain configs/examples/red_ball_rolls.yaml --fractions\n"
    "  tessera run configs/experiments/quickstart.yaml             the experiment over its dataset\n"
    "  tessera run configs/experiments/quickstart.yaml --set runtime.batch_size=2 --set "
    "plugins.3.options.max_length=64\n"
    "  tessera tokenize configs/experiments/quickstart.yaml --plugin 3 --input "
    "tests/data/protein/messy.fasta\n"
    "  tessera generate configs/examples/generate_tiny.yaml --prompt \"Once upon a time\"\n"
    "  tessera bench configs/bench/vit_b16.yaml --reps 5\n"
    "  tessera plugins --options\n"
    "(The paths are the source tree's.) Run `tessera SUBCOMMAND --help` for a subcommand's options.";

// "MPI: Open MPI v4.1.4 (built in), rank 0 of 2" or "MPI: not built in ...".
std::string mpi_text() {
  std::string lib = mpi_library();
  if (lib.empty()) return "MPI: not built in (build with Debian's libopenmpi-dev to run under mpirun)";
  lib = lib.substr(0, lib.find(','));
  const Comm& c = Comm::world();
  return "MPI: " + lib + " (built in), " +
         (started_by_mpi_launcher() ? "rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size())
                                    : std::string("one process (not started by mpirun or srun)"));
}

std::string version_text() {
  const RuntimeInfo ri = runtime_info();
  return std::string("tessera ") + TESSERA_VERSION + "\noneDNN " + ri.onednn_version + ", " + ri.isa + ", " +
         std::to_string(ri.threads) + " threads, bf16 " + (ri.native_bf16 ? "native" : "emulated in f32") + "\n" +
         mpi_text();
}

void add_version(CLI::App& app, std::function<int()>* run) {
  CLI::App* cmd =
      app.add_subcommand("version", "Print Tessera's version and the runtime it found (also --version)");
  cmd->callback([run] {
    *run = [] {
      std::printf("%s\n", version_text().c_str());
      return kExitOk;
    };
  });
}

// "tessera" or "tessera run": who speaks in a usage error about `app`.
std::string who(const CLI::App& app) {
  return app.get_parent() ? "tessera " + app.get_name() : std::string("tessera");
}

// A usage error about the first argument `app` could not place: an option it does not have (with
// the nearest of its long options), a subcommand that does not exist (the root: the nearest
// subcommand), or an argument too many. Returns the exit code.
int report_unplaced(CLI::App& app, const std::string& arg) {
  const std::string me = who(app);
  if (arg.size() > 1 && arg[0] == '-') {
    const std::string name = arg.substr(0, arg.find('='));  // --batch-size=4: the option is --batch-size
    std::vector<std::string> longs;
    for (const CLI::Option* o : app.get_options())
      for (const std::string& l : o->get_lnames()) longs.push_back(l);
    const size_t bare = name.find_first_not_of('-');  // "---" or "-=1": no name at all
    const std::string near = bare == std::string::npos ? "" : nearest_name(name.substr(bare), longs);
    if (!near.empty()) {
      std::fprintf(stderr, "%s: unknown option '%s'. Did you mean '--%s'?\n", me.c_str(), name.c_str(),
                   near.c_str());
    } else {
      std::fprintf(stderr, "%s: unknown option '%s'; see `%s --help` for its options\n", me.c_str(),
                   name.c_str(), me.c_str());
    }
    return kExitBadInput;
  }
  if (!app.get_parent()) {
    std::vector<std::string> subs;
    for (const CLI::App* s : app.get_subcommands([](CLI::App*) { return true; }))
      subs.push_back(s->get_name());
    const std::string near = nearest_name(arg, subs);
    if (!near.empty()) {
      std::fprintf(stderr, "tessera: unknown subcommand '%s'. Did you mean '%s'?\n", arg.c_str(),
                   near.c_str());
    } else {
      std::string list;
      for (const std::string& s : subs) list += (list.empty() ? "" : ", ") + s;
      std::fprintf(stderr,
                   "tessera: unknown subcommand '%s'; the subcommands are: %s\nRun `tessera --help` for what "
                   "each one does.\n",
                   arg.c_str(), list.c_str());
    }
    return kExitBadInput;
  }
  std::fprintf(stderr, "%s: unexpected argument '%s'; see `%s --help` for its arguments\n", me.c_str(),
               arg.c_str(), me.c_str());
  return kExitBadInput;
}

// The first argument the parse left over, in the root or the chosen subcommand: reported, exit 2;
// -1 when every argument found its place.
int check_unplaced(CLI::App& app) {
  if (!app.remaining().empty()) return report_unplaced(app, app.remaining().front());
  for (CLI::App* sub : app.get_subcommands())
    if (!sub->remaining().empty()) return report_unplaced(*sub, sub->remaining().front());
  return -1;
}

// The running subcommand's name, for the last words below ("tessera forward"); "tessera" before
// the parse has chosen one. Plain chars: written once, read when memory may have run out.
char g_who[64] = "tessera";

// Where an allocation failure that escaped a subcommand ends: one line saying so, exit 1. Used by
// main's catch and by the terminate handler (a thread's or an OpenMP region's escaped exception).
// Writes with fputs only: the failed allocation is gone, but nothing here allocates anyway.
[[noreturn]] void die_out_of_memory() {
  std::fputs(g_who, stderr);
  std::fputs(
      ": out of memory: an allocation failed, so nothing more was done (finished outputs are kept). "
      "`tessera check` prints the model's memory plan; lower the batch size (--set runtime.batch_size=N), "
      "the input's length or the model's size, or free memory\n",
      stderr);
  std::fflush(stdout);  // results printed so far are kept
  std::fflush(stderr);
  std::_Exit(kExitFailure);
}

[[noreturn]] void die_internal(const char* what) {
  std::fprintf(stderr, "%s: internal error: %s (uncaught exception; please report it)\n", g_who, what);
  std::fflush(stdout);  // results printed so far are kept
  std::fflush(stderr);
  std::_Exit(kExitFailure);
}

// std::terminate's handler: an exception that no one caught (one thrown in a worker thread).
[[noreturn]] void on_terminate() {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      die_out_of_memory();
    } catch (const std::exception& x) {
      die_internal(x.what());
    } catch (...) {
      die_internal("an exception of unknown type");
    }
  }
  std::fputs("tessera: internal error: std::terminate without an exception\n", stderr);
  std::abort();
}

}  // namespace

void add_schema_command(CLI::App& app, std::function<int()>* run) {
  auto markdown = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("schema", "List every config key with its type, default and meaning");
  cmd->add_flag("--markdown", *markdown, "print the table of docs/CONFIG.md");
  cmd->callback([markdown, run] {
    *run = [markdown] {
      if (*markdown) {
        std::printf("%s", schema_markdown().c_str());
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows{{"key", "type", "default"}};
      for (const KeySpec& k : config_schema()) rows.push_back({k.path, k.type, k.default_value});
      std::printf("%s", table(rows, 0).c_str());
      return kExitOk;
    };
  });
}

}  // namespace tessera::cli

int main(int argc, char** argv) {
  using namespace tessera::cli;
  std::set_terminate(on_terminate);
  // A file that reaches the size limit (ulimit -f) is a write that fails with EFBIG, reported with
  // the file like a full disk, instead of a process killed by SIGXFSZ with nothing said.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"tessera: transformers over any modality, on oneDNN", "tessera"};
  // Arguments no option or subcommand takes are kept (subcommands inherit this) and reported by
  // check_unplaced with the nearest name, instead of CLI11's "arguments were not expected".
  app.allow_extras();
  app.set_version_flag("--version", version_text, "print Tessera's version and the runtime it found");
  app.footer(kExamples);
  app.failure_message([](const CLI::App* root, const CLI::Error& e) {
    const CLI::App* sub = root->get_subcommands().empty() ? root : root->get_subcommands().front();
    return who(*sub) + ": " + e.what() + "\nRun `" + who(*sub) + " --help` for its usage.\n";
  });
  std::function<int()> run;
  add_run_command(app, &run);
  add_generate_command(app, &run);
  add_check_command(app, &run);
  add_explain_command(app, &run);
  add_forward_command(app, &run);
  add_bench_command(app, &run);
  add_drift_command(app, &run);
  add_export_command(app, &run);
  add_grad_command(app, &run);
  add_train_command(app, &run);
  add_eval_command(app, &run);
  add_plugins_command(app, &run);
  add_tokenize_command(app, &run);
  add_schema_command(app, &run);
  add_search_command(app, &run);
  add_version(app, &run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A missing required argument beside a mistyped one: the mistyped one is the news.
    if (e.get_exit_code() != 0) {
      if (const int rc = check_unplaced(app); rc >= 0) return rc;
    }
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  if (const int rc = check_unplaced(app); rc >= 0) return rc;
  if (app.get_subcommands().empty()) {  // bare `tessera`: the help, on stdout
    std::printf("%s", app.help().c_str());
    return kExitOk;
  }
  if (!run) return kExitBadInput;
  std::snprintf(g_who, sizeof g_who, "tessera %s", app.get_subcommands().front()->get_name().c_str());
  // Out of memory is a failure of this run, not a crash: exit 1 with a message, never an abort.
  try {
    return run();
  } catch (const std::bad_alloc&) {
    die_out_of_memory();
  } catch (const std::exception& e) {
    die_internal(e.what());
  }
}
