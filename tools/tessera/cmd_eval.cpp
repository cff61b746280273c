// `tessera eval`: a trained model on held-out data. Classifiers: accuracy, macro-F1, a per-class
// table and the confusion matrix; language models: loss, perplexity, bits per token and per
// character. `--out DIR` writes the same as eval.json.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/train.h"

namespace tessera::cli {

namespace {

struct EvalArgs {
  std::string file, weights, data, labels, out_dir;
  std::vector<std::string> overrides;
  bool test = false;
};

struct ClassScore {
  int64_t support = 0, predicted = 0, right = 0;
  double precision() const { return predicted ? static_cast<double>(right) / static_cast<double>(predicted) : 0; }
  double recall() const { return support ? static_cast<double>(right) / static_cast<double>(support) : 0; }
  double f1() const { return right ? 2.0 * static_cast<double>(right) / static_cast<double>(support + predicted) : 0; }
};

std::vector<ClassScore> class_scores(const std::vector<std::vector<int64_t>>& confusion) {
  const size_t K = confusion.size();
  std::vector<ClassScore> s(K);
  for (size_t t = 0; t < K; ++t)
    for (size_t p = 0; p < K; ++p) {
      s[t].support += confusion[t][p];
      s[p].predicted += confusion[t][p];
      if (t == p) s[t].right += confusion[t][p];
    }
  return s;
}

int run_eval(const EvalArgs& a) {
  std::optional<Experiment> exp = load(a.file, a.overrides);
  if (!exp) return kExitBadInput;
  if (exp->runtime.threads > 0) set_num_threads(exp->runtime.threads);
  EvalOptions o;
  o.weights = a.weights;
  o.data = a.data;
  o.labels = a.labels;
  o.test = a.test;
  Result<EvalReport> r = evaluate_experiment(*exp, o);
  if (!r.ok()) {
    std::fprintf(stderr, "tessera eval: %s\n", r.status().message().c_str());
    return r.status().code() == Code::invalid_argument || r.status().code() == Code::not_found ? kExitBadInput
                                                                                             : kExitFailure;
  }
  const EvalReport& rep = *r;
  const EvalResult& e = rep.result;
  nlohmann::json j = {{"set", rep.set}, {"weights", a.weights}, {"loss", e.loss}, {"counted", e.counted}};
  if (rep.failed) std::printf("%lld item(s) could not be read and are not counted\n", static_cast<long long>(rep.failed));
  if (e.accuracy >= 0 && e.bits_per_token >= 0) {  // a masked LM
    std::printf("%s: %lld masked rows\n", rep.set.c_str(), static_cast<long long>(e.counted));
    std::printf("masked-token loss %.4f nats   perplexity %.3f   %.4f bits per token   accuracy %.2f %%\n", e.loss,
                std::exp(e.loss), e.bits_per_token, 100 * e.accuracy);
    j["perplexity"] = std::exp(e.loss);
    j["bits_per_token"] = e.bits_per_token;
    j["accuracy"] = e.accuracy;
  } else if (e.accuracy >= 0) {
    std::printf("%s: %lld items\n", rep.set.c_str(), static_cast<long long>(e.counted));
    std::printf("accuracy %.2f %%   macro-F1 %.4f   loss %.4f\n\n", 100 * e.accuracy, e.macro_f1, e.loss);
    // A multi-task head (model.head.tasks): each task over its own items, predicted within its classes.
    for (const TaskEval& t : e.tasks) {
      std::printf("task %s: %lld items   accuracy %.2f %%   macro-F1 %.4f   loss %.4f\n", t.name.c_str(),
                  static_cast<long long>(t.counted), 100 * t.accuracy, t.macro_f1, t.loss);
      j["tasks"][t.name] = {{"accuracy", t.accuracy}, {"macro_f1", t.macro_f1}, {"loss", t.loss},
                            {"counted", t.counted}, {"confusion", t.confusion}};
    }
    if (!e.tasks.empty()) std::printf("\n");
    const std::vector<ClassScore> s = class_scores(e.confusion);
    size_t w = 5;
    for (const std::string& c : rep.classes) w = std::max(w, c.size());
    std::printf("%-*s  precision  recall  F1      support\n", static_cast<int>(w), "class");
    nlohmann::json per = nlohmann::json::array();
    for (size_t k = 0; k < s.size(); ++k) {
      const std::string name = k < rep.classes.size() ? rep.classes[k] : std::to_string(k);
      std::printf("%-*s  %.4f     %.4f  %.4f  %lld\n", static_cast<int>(w), name.c_str(), s[k].precision(),
                  s[k].recall(), s[k].f1(), static_cast<long long>(s[k].support));
      per.push_back({{"class", name}, {"precision", s[k].precision()}, {"recall", s[k].recall()}, {"f1", s[k].f1()},
                     {"support", s[k].support}});
    }
    std::printf("\nconfusion matrix (rows: the true class, columns: the predicted one, in the order above)\n");
    for (const auto& row : e.confusion) {
      for (int64_t v : row) std::printf(" %6lld", static_cast<long long>(v));
      std::printf("\n");
    }
    j["accuracy"] = e.accuracy;
    j["macro_f1"] = e.macro_f1;
    j["classes"] = per;
    j["confusion"] = e.confusion;
  } else {
    std::printf("%s: %lld predicted tokens\n", rep.set.c_str(), static_cast<long long>(e.counted));
    std::printf("loss %.4f nats   perplexity %.3f   %.4f bits per token", e.loss, std::exp(e.loss), e.bits_per_token);
    if (e.bits_per_character >= 0) std::printf("   %.4f bits per character", e.bits_per_character);
    std::printf("\n");
    j["perplexity"] = std::exp(e.loss);
    j["bits_per_token"] = e.bits_per_token;
    if (e.bits_per_character >= 0) {
      j["bits_per_character"] = e.bits_per_character;
      j["characters"] = e.characters;
    }
  }
  if (!a.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.out_dir, ec);
    const std::string path = (std::filesystem::path(a.out_dir) / "eval.json").string();
    const Status st = write_file_atomic(path, j.dump(2) + "\n");
    if (!st.ok()) {
      std::fprintf(stderr, "tessera eval: %s\n", st.message().c_str());
      return kExitFailure;
    }
    std::printf("wrote %s\n", path.c_str());
  }
  return kExitOk;
}

}  // namespace

void add_eval_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Score trained weights on held-out data (accuracy, F1; bits per token)");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--weights", args->weights, "weights file (runs/NAME/best.safetensors); default: model.weights");
  cmd->add_option("--data", args->data, "another data set, scored whole (default: the held-out validation set)");
  cmd->add_option("--labels", args->labels, "the IDX labels file of --data");
  cmd->add_flag("--test", args->test, "score train.test_data");
  cmd->add_option("--out", args->out_dir, "write DIR/eval.json");
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_eval(*args); }; });
}

}  // namespace tessera::cli
