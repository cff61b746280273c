// `tessera grad`: one batch's loss and the gradient of every parameter, written to a safetensors
// file under the parameters' own names, so that anyone can hold Tessera's gradients against their
// own reference (PyTorch autograd, finite differences).
//
// The loss follows the model's head: an LM head takes next-token cross-entropy over the input ids;
// a classifier takes cross-entropy against --label; a model without either takes the sum of its
// final rows (every entry's gradient is then d(Σ hidden)/dθ). With --item N the batch is the N-th
// item of the experiment's dataset, encoded as the trainer encodes it, with the targets training
// gives it: its label, its next tokens, or (train.objective: mlm) its masks.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "common.h"
#include "tessera/safetensors.h"
#include "tessera/train.h"

namespace tessera::cli {

namespace {

struct GradArgs {
  std::string file, ids, rows, out_dir = "tessera-grad";
  std::vector<std::string> overrides;
  int label = -1;
  int64_t item = -1;
  float label_smoothing = 0.f;
  bool reference = false;
};

int run_grad(const GradArgs& a) {
  std::optional<Experiment> exp = load(a.file, a.overrides);
  if (!exp) return kExitBadInput;
  const ModelConfig& c = exp->model;
  if (a.item >= 0 && (!a.ids.empty() || !a.rows.empty() || a.label >= 0)) {
    std::fprintf(stderr, "tessera grad: --item takes the item and its targets from the dataset: give it without --ids, "
                         "--rows and --label\n");
    return kExitBadInput;
  }
  if (a.item < 0 && exp->train.objective == Objective::mlm) {
    // Next-token targets would be the wrong loss for a masked LM, and its masks draw random
    // tokens from the training set: only a dataset item has both.
    std::fprintf(stderr, "tessera grad: %s: train.objective is mlm, whose targets are an item's masks: give --item N "
                         "(the N-th item of the dataset, masked as training masks it), not --ids or --rows\n",
                 a.file.c_str());
    return kExitBadInput;
  }
  std::optional<ExperimentItem> from_data;
  if (a.item >= 0) {
    Result<ExperimentItem> it = experiment_item(*exp, a.item);
    if (!it.ok()) {
      std::fprintf(stderr, "tessera grad: %s\n", it.status().message().c_str());
      return kExitBadInput;
    }
    from_data = std::move(it).value();
  }
  if (!from_data && c.head.kind == HeadKind::classifier && (a.label < 0 || a.label >= c.head.n_classes)) {
    std::fprintf(stderr, "tessera grad: the model is a classifier of %lld classes: give the item's class with "
                         "--label N (0 <= N < %lld)\n",
                 static_cast<long long>(c.head.n_classes), static_cast<long long>(c.head.n_classes));
    return kExitBadInput;
  }
  std::optional<Batch> batch = from_data ? std::optional<Batch>(from_data->batch) : input_batch(*exp, a.ids, a.rows);
  if (!batch) return kExitBadInput;
  Result<Parameters> resolved = Parameters::resolve(c);
  if (!resolved.ok()) {
    std::fprintf(stderr, "tessera grad: %s\n", resolved.status().message().c_str());
    return kExitBadInput;
  }
  const Parameters params = resolved->clone();
  Targets targets;
  targets.label_smoothing = a.label_smoothing;
  std::string loss_name;
  if (from_data) {
    targets = from_data->targets;
    loss_name = from_data->loss;
    std::printf("item %lld: %s\n", static_cast<long long>(a.item), from_data->id.c_str());
    for (size_t s = 0; s < from_data->choices.size(); ++s) {
      std::string rows;  // the chosen rows: 3 (masked), 7 (random), 9 (kept)
      const char* what[] = {"", "masked", "random", "kept"};
      for (size_t t = 0; t < from_data->choices[s].size(); ++t)
        if (from_data->choices[s][t] != MaskChoice::none)
          rows += (rows.empty() ? "" : ", ") + std::to_string(t) + " (" + what[static_cast<int>(from_data->choices[s][t])] + ")";
      std::printf("chosen rows%s: %s\n", from_data->choices.size() > 1 ? (" of sequence " + std::to_string(s)).c_str() : "",
                  rows.c_str());
    }
  } else if (c.head.kind == HeadKind::lm) {
    targets.tokens = next_token_targets(*batch);
    loss_name = "next-token cross-entropy";
  } else if (c.head.kind == HeadKind::classifier) {
    targets.labels = Tensor::from_ids({batch->batch_size()}, std::vector<int32_t>(static_cast<size_t>(batch->batch_size()), a.label));
    loss_name = "cross-entropy against --label";
  } else {
    Result<Model> m = Model::build(c, params);
    if (!m.ok()) {
      std::fprintf(stderr, "tessera grad: %s\n", m.status().message().c_str());
      return kExitBadInput;
    }
    Outputs out;  // the final rows' shape: (B, T', C), or the heads' width for one bare attention layer
    if (Status st = m->forward(*batch, {}, &out); !st.ok()) {
      std::fprintf(stderr, "tessera grad: %s\n", st.message().c_str());
      return kExitFailure;
    }
    targets.probe = Tensor::full(out.hidden.shape(), 1.f);
    loss_name = "sum of the final rows";
  }
  Parameters grads = params.zeros_like();
  GradOptions opt;
  opt.reference = a.reference || exp->runtime.reference;
  opt.precision = exp->train.precision;  // the step's arithmetic, as `tessera train` would run it
  Result<LossValue> r = compute_gradients(c, params, *batch, targets, &grads, opt);
  if (!r.ok()) {
    std::fprintf(stderr, "tessera grad: %s\n", r.status().message().c_str());
    return kExitFailure;
  }
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "tessera grad: cannot create %s: %s\n", a.out_dir.c_str(), ec.message().c_str());
    return kExitFailure;
  }
  std::vector<std::pair<std::string, Tensor>> tensors(grads.begin(), grads.end());
  tensors.emplace_back("loss", Tensor::full({1}, static_cast<float>(r->loss)));
  if (r->d_rows.defined()) tensors.emplace_back("input.rows", r->d_rows);
  const std::string path = (std::filesystem::path(a.out_dir) / "grad.safetensors").string();
  if (Status st = safetensors::write(path, tensors); !st.ok()) {
    std::fprintf(stderr, "tessera grad: %s\n", st.message().c_str());
    return kExitFailure;
  }
  const char* unit = c.head.kind == HeadKind::lm ? "row" : "item";
  std::printf("loss %s (%s, over %lld %s%s)\n", fmt(r->loss, 6, false).c_str(), loss_name.c_str(),
              static_cast<long long>(r->counted), unit, r->counted == 1 ? "" : "s");
  std::vector<std::vector<std::string>> rows{{"parameter", "shape", "|grad|"}};
  double total = 0;
  for (const auto& [name, g] : grads) {
    double ss = 0;
    for (float v : g.to_vector()) ss += static_cast<double>(v) * v;
    total += ss;
    rows.push_back({name, g.shape().str(), fmt(std::sqrt(ss), 6, false)});
  }
  std::printf("%s", table(rows, 2).c_str());
  std::printf("global gradient norm %s\nwrote %s (every parameter's gradient under its own name, and \"loss\")\n",
              fmt(std::sqrt(total), 6, false).c_str(), path.c_str());
  return kExitOk;
}

}  // namespace

void add_grad_command(CLI::App& app, std::function<int()>* run) {
  auto args = std::make_shared<GradArgs>();
  CLI::App* cmd = app.add_subcommand("grad", "One batch's loss and every parameter's gradient, as safetensors");
  cmd->add_option("file", args->file, "experiment YAML")->required();
  cmd->add_option("--ids", args->ids, "token ids, comma-separated (default: the experiment's input)");
  cmd->add_option("--rows", args->rows, "feature rows, .npy of (T, F) or (B, T, F)");
  cmd->add_option("--label", args->label, "the item's class, for a classifier");
  cmd->add_option("--item", args->item,
                  "the N-th item (from 0) of the experiment's dataset, with its label, next tokens or masks")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--label-smoothing", args->label_smoothing, "label smoothing in [0, 1)")->check(CLI::Range(0.0, 0.999));
  cmd->add_option("--out", args->out_dir, "output folder (grad.safetensors)")->capture_default_str();
  cmd->add_flag("--reference", args->reference, "run the plain reference loops instead of oneDNN");
  cmd->add_option("--set", args->overrides, "override a config key: key.path=value (repeatable)");
  cmd->callback([args, run] { *run = [args] { return run_grad(*args); }; });
}

}  // namespace tessera::cli
