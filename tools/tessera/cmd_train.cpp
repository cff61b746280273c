// `tessera train`: train the experiment's model on its dataset (train.* in the YAML), with
// metrics.jsonl, checkpoints and the best weights in the run folder; `--resume` continues a
// killed run to the weights it would have reached.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "tessera/comm.h"
#include "common.h"
#include "tessera/train.h"

namespace tessera::cli {

namespace {

struct TrainArgs {
  std::string file, out_dir;
  std::vector<std::string> overrides;
  bool resume = false, force = false, quiet = false;
};

int run_train(const TrainArgs& a) {
  std::optional<Experiment> exp = load(a.file, a.overrides);
  if (!exp) return kExitBadInput;
  if (exp->runtime.threads > 0) set_num_threads(exp->runtime.threads);
  TrainOptions opt;
  opt.out_dir = a.out_dir;
  opt.resume = a.resume;
  opt.force = a.force;
  opt.progress = !a.quiet;
  Result<TrainSummary> r = train_experiment(*exp, opt);
  if (!r.ok()) {
    // Under MPI each rank says its own failure, naming itself (rank 1's may be the only one).
    const Comm& c = Comm::world();
    const std::string who = c.distributed() ? "rank " + std::to_string(c.rank()) + ": " : "";
    std::fprintf(stderr, "tessera train: %s%s\n", who.c_str(), r.status().message().c_str());
    return r.status().code() == Code::invalid_argument ? kExitBadInput : kExitFailure;
  }
  const TrainSummary& s = *r;
  if (Comm::world().rank() != 0) return kExitOk;  // under MPI, rank 0 speaks for the job
  std::printf("trained %lld steps%s in %.1f s; run folder %s\n", static_cast<long long>(s.steps),
              s.steps_resumed ? (" (" + std::to_string(s.steps_resumed) + " before the resume)").c_str() : "",
              s.seconds, s.dir.c_str());
  auto describe = [](const EvalResult& e) {
    std::string t = "loss " + fmt(e.loss, 4, false);
    if (e.accuracy >= 0) t += ", accuracy " + fmt(100 * e.accuracy, 2, false) + " %";
    if (e.macro_f1 >= 0) t += ", macro-F1 " + fmt(e.macro_f1, 4, false);
    if (e.bits_per_token >= 0) t += ", " + fmt(e.bits_per_token, 4, false) + " bits per token";
    for (const TaskEval& k : e.tasks)  // a multi-task head: each task over its own items
      t += "\n  task " + k.name + ": accuracy " + fmt(100 * k.accuracy, 2, false) + " %, macro-F1 " +
           fmt(k.macro_f1, 4, false) + ", loss " + fmt(k.loss, 4, false) + " (" + std::to_string(k.counted) + " items)";
    if (!e.tasks.empty())
      t += "\n  mean of the tasks' accuracies: " + fmt(100 * metric_value(TrainMetric::task_mean, e), 2, false) + " %";
    return t;
  };
  std::printf("best validation (step %lld, by train.metric %s): %s\n", static_cast<long long>(s.best_step),
              train_metric_name(s.metric), describe(s.best).c_str());
  if (s.test.counted) std::printf("test (best weights): %s\n", describe(s.test).c_str());
  if (s.stopped_early) std::printf("stopped early: no better validation for train.patience evaluations\n");
  if (exp->train.baseline == Baseline::none)
    std::printf("best weights: %s/best.safetensors (run them with model.weights.file)\n", s.dir.c_str());
  else if (exp->train.baseline == Baseline::proximity)
    std::printf("proximity baseline's best weights: %s/best.safetensors (stem.embed, proximity.w, proximity.b)\n",
                s.dir.c_str());
  return kExitOk;
}

}  // namespace

void add_train_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train the experiment's model on its dataset (train.* keys)");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--out", args->out_dir, "run folder (default: outputs.dir)");
  cmd->add_flag("--resume", args->resume, "continue the run in the run folder from its latest checkpoint");
  cmd->add_flag("--force", args->force, "start over in a run folder that already holds a training run");
  cmd->add_flag("--quiet", args->quiet, "no progress on stderr");
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_train(*args); }; });
}

}  // namespace tessera::cli
