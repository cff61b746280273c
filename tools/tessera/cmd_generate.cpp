// `tessera generate`: continues text prompts with an experiment's causal language model. The
// experiment's text plugin encodes the prompts and decodes the new tokens (the same checks as
// `tessera run`'s generate task, tessera/run.h); the decode loop with its KV cache is core's
// (tessera/generate.h). This file reads prompts and options and prints.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "tessera/fileio.h"
#include "tessera/generate.h"
#include "tessera/run.h"

namespace tessera::cli {

namespace {

struct GenerateArgs {
  std::string file, prompts_file;
  std::vector<std::string> prompts, stop, overrides;
  std::vector<int32_t> stop_ids;
  int64_t max_new_tokens = 0, top_k = 0, batch_size = 0;
  double temperature = 0, top_p = 0, repetition_penalty = 0;
  uint64_t seed = 0;
  int threads = -1;
  bool stream = false, json = false;
  // Which generation options were given: those replace the experiment's task.generate values.
  CLI::Option *max_new_tokens_opt = nullptr, *temperature_opt = nullptr, *top_k_opt = nullptr, *top_p_opt = nullptr,
              *penalty_opt = nullptr, *seed_opt = nullptr, *stop_opt = nullptr, *stop_ids_opt = nullptr;
};

struct Prompt {
  std::string id;    // "--prompt 2", "prompts.txt:7"
  std::string text;
  std::string source;
  uint32_t line = 0;
  std::vector<int32_t> ids;
};

// Every non-empty line of the file, as the dataset's text lines are read (a UTF-8 byte-order mark
// skipped, `\r\n` accepted).
Status read_prompt_lines(const std::string& path, std::vector<Prompt>* out) {
  Result<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  std::string all = std::move(text).value();
  if (all.rfind("\xEF\xBB\xBF", 0) == 0) all.erase(0, 3);
  size_t pos = 0;
  for (uint32_t line = 1; pos < all.size(); ++line) {
    size_t eol = all.find('\n', pos);
    if (eol == std::string::npos) eol = all.size();
    std::string s = all.substr(pos, eol - pos);
    if (!s.empty() && s.back() == '\r') s.pop_back();
    const std::string name = path.substr(path.find_last_of('/') + 1);
    if (!s.empty()) out->push_back({name + ":" + std::to_string(line), s, path, line, {}});
    pos = eol + 1;
  }
  return Status::Ok();
}

int exit_code(const Status& st) {
  return st.code() == Code::internal || st.code() == Code::io_error ? kExitFailure : kExitBadInput;
}

int run_generate(const GenerateArgs& a) {
  if (a.stream && a.json) {
    std::fprintf(stderr, "tessera generate: --stream prints the text as it comes, --json one line per prompt once it "
                         "is done: choose one\n");
    return kExitBadInput;
  }
  std::vector<Prompt> prompts;
  for (size_t i = 0; i < a.prompts.size(); ++i)
    prompts.push_back({"--prompt " + std::to_string(i + 1), a.prompts[i], "", 0, {}});
  if (!a.prompts_file.empty()) {
    if (Status st = read_prompt_lines(a.prompts_file, &prompts); !st.ok()) {
      std::fprintf(stderr, "tessera generate: --prompts: %s\n", st.message().c_str());
      return kExitBadInput;
    }
  }
  if (prompts.empty()) {
    std::fprintf(stderr, "tessera generate: no prompt: give --prompt TEXT (repeatable) or --prompts FILE (one per "
                         "line)\n");
    return kExitBadInput;
  }
  std::vector<std::string> overrides = a.overrides;
  if (a.threads >= 0) overrides.push_back("runtime.threads=" + std::to_string(a.threads));
  if (a.batch_size > 0) overrides.push_back("runtime.batch_size=" + std::to_string(a.batch_size));
  std::optional<Loaded> L = load_and_build(a.file, overrides);
  if (!L) return load_failure_exit_code();
  const Experiment& exp = L->exp;
  Result<Encoder> enc = generation_encoder(exp);
  if (!enc.ok()) {
    std::fprintf(stderr, "tessera generate: %s\n", enc.status().message().c_str());
    return kExitBadInput;
  }

  // task.generate, with the options given here in its place.
  GenerateOptions o = generate_options(exp.task.generate);
  if (a.max_new_tokens_opt->count()) o.max_new_tokens = a.max_new_tokens;
  if (a.temperature_opt->count()) o.temperature = a.temperature;
  if (a.top_k_opt->count()) o.top_k = a.top_k;
  if (a.top_p_opt->count()) o.top_p = a.top_p;
  if (a.penalty_opt->count()) o.repetition_penalty = a.repetition_penalty;
  if (a.seed_opt->count()) o.seed = a.seed;
  if (a.stop_opt->count()) o.stop_strings = a.stop;
  if (a.stop_ids_opt->count()) {
    o.stop_ids = a.stop_ids;
  }
  o.reference = exp.runtime.reference;
  const Encoder& dec = *enc;
  o.decode = [&dec](const std::vector<int32_t>& ids) { return dec.decode(ids); };
  if (Status st = check_generate_options(o); !st.ok()) {
    std::fprintf(stderr, "tessera %s\n", st.message().c_str());
    return kExitBadInput;
  }

  for (Prompt& p : prompts) {
    PluginItem item;
    item.id = p.id;
    item.source = p.source;
    item.source_line = p.line;
    item.data = p.text;
    Result<std::vector<TokenRows>> rows = enc->encode(item);
    if (!rows.ok()) {
      std::fprintf(stderr, "tessera generate: %s\n", rows.status().message().c_str());
      return kExitBadInput;
    }
    if (rows->size() != 1) {
      std::fprintf(stderr, "tessera generate: %s: the plugin gave %zu sequences; a prompt is one sequence\n",
                   p.id.c_str(), rows->size());
      return kExitBadInput;
    }
    std::vector<int32_t> eos;
    p.ids = prompt_ids((*rows)[0], &eos);
    for (int32_t id : eos)  // the tokenizer's own end of text (add_special): the model's EOS
      if (std::find(o.eos_ids.begin(), o.eos_ids.end(), id) == o.eos_ids.end()) o.eos_ids.push_back(id);
    if (p.ids.empty()) {
      std::fprintf(stderr, "tessera generate: %s: no token is left once the closing special rows are removed\n",
                   p.id.c_str());
      return kExitBadInput;
    }
    // generate() would refuse it too, but by its place in a batch; here it is named.
    const PositionConfig& pos = exp.model.positions;
    if ((pos.kind == PositionKind::learned || pos.kind == PositionKind::sinusoidal) &&
        static_cast<int64_t>(p.ids.size()) > pos.max_len) {
      std::fprintf(stderr, "tessera generate: %s: %zu tokens, more than model.positions.max_len (%lld): shorten it, or "
                           "raise max_len\n", p.id.c_str(), p.ids.size(), static_cast<long long>(pos.max_len));
      return kExitBadInput;
    }
  }

  // Streaming shows one prompt at a time; otherwise runtime.batch_size prompts decode together.
  const size_t batch = a.stream ? 1 : static_cast<size_t>(exp.runtime.batch_size);
  for (size_t start = 0; start < prompts.size(); start += batch) {
    const size_t end = std::min(prompts.size(), start + batch);
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = start; i < end; ++i) ids.push_back(prompts[i].ids);
    if (a.stream) {
      std::fputs(prompts[start].text.c_str(), stdout);
      std::fflush(stdout);
      o.on_token = [](const TokenEvent& e) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
        std::fflush(stdout);
      };
    }
    Result<std::vector<Generation>> r = generate(L->model, ids, o);
    if (!r.ok()) {
      if (a.stream) std::fputs("\n", stdout);
      std::fprintf(stderr, "tessera %s\n", r.status().message().c_str());
      return exit_code(r.status());
    }
    for (size_t i = start; i < end; ++i) {
      const Prompt& p = prompts[i];
      const Generation& g = (*r)[i - start];
      const double rate = g.seconds > 0 ? static_cast<double>(g.ids.size()) / g.seconds : 0.0;
      if (a.json) {
        nlohmann::json j = {{"prompt", p.text},          {"completion", g.text},
                            {"ids", g.ids},              {"finish_reason", g.finish_reason},
                            {"prompt_tokens", g.prompt_tokens}, {"new_tokens", g.ids.size()},
                            {"seconds", g.seconds},      {"tokens_per_s", rate}};
        if (!g.note.empty()) j["note"] = g.note;
        std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      } else {
        if (!a.stream) std::fputs((p.text + g.text).c_str(), stdout);
        std::fputs("\n", stdout);
      }
      std::fflush(stdout);
      std::fprintf(stderr, "generate: %s: %zu new tokens (%s), %s tokens/s\n", p.id.c_str(), g.ids.size(),
                   g.finish_reason.c_str(), fmt(rate, 1, false).c_str());
      if (!g.note.empty()) std::fprintf(stderr, "generate: %s: %s\n", p.id.c_str(), g.note.c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void add_generate_command(CLI::App& app, std::function<int()>* run) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Continue text prompts with an experiment's causal language model, through its text plugin");
  cmd->add_option("file", a->file, "experiment YAML: a causal LM (head.kind lm) and one text plugin")->required();
  cmd->add_option("--prompt", a->prompts, "a prompt (repeatable)");
  cmd->add_option("--prompts", a->prompts_file, "a file of prompts, one per line (empty lines skipped)");
  a->max_new_tokens_opt = cmd->add_option("--max-new-tokens", a->max_new_tokens,
                                          "most new tokens per prompt (default: task.generate)")
                              ->check(CLI::Range(int64_t{1}, limits::kSequence));
  a->temperature_opt =
      cmd->add_option("--temperature", a->temperature, "0: greedy; > 0: sample (default: task.generate, 0)");
  a->top_k_opt = cmd->add_option("--top-k", a->top_k, "sample among the k most likely tokens; 0: all")
                     ->check(CLI::Range(int64_t{0}, limits::kVocab));
  a->top_p_opt = cmd->add_option("--top-p", a->top_p, "sample among the most likely tokens that add up to p; 1: all");
  a->penalty_opt = cmd->add_option("--repetition-penalty", a->repetition_penalty,
                                   "penalise tokens already in the sequence (Hugging Face's); 1: none");
  a->seed_opt = cmd->add_option("--seed", a->seed, "seed of each prompt's random generator");
  a->stop_opt = cmd->add_option("--stop", a->stop, "stop when the completion contains this text (repeatable)");
  a->stop_ids_opt = cmd->add_option("--stop-id", a->stop_ids,
                                    "stop after this token id (repeatable; finish_reason \"stop\")");
  cmd->add_flag("--stream", a->stream, "print each prompt's text as it is generated (prompts one after another)");
  cmd->add_flag("--json", a->json,
                "one JSON line per prompt: prompt, completion, ids, finish_reason, prompt_tokens, new_tokens, "
                "seconds, tokens_per_s");
  cmd->add_option("--batch-size", a->batch_size, "prompts decoded together (default: runtime.batch_size)")
      ->check(CLI::Range(int64_t{1}, limits::kBatch));
  cmd->add_option("--threads", a->threads, "intra-op threads (default: runtime.threads; 0 = all cores)")
      ->check(CLI::Range(0, static_cast<int>(limits::kThreads)));
  cmd->add_option("--set", a->overrides, "override a config key: key.path=value (repeatable)");
  cmd->footer("Without --json, each prompt is printed followed by its completion; a summary per prompt goes to "
              "stderr. Options not given come from the experiment's task.generate. Exit codes: 0 ok, 2 bad input, "
              "1 failure.");
  cmd->callback([a, run] { *run = [a] { return run_generate(*a); }; });
}

}  // namespace tessera::cli
