// What `tessera generate` and the runner's generate task share: the experiment's tokenizer plugin,
// checked for generation, and task.generate as GenerateOptions. The decode loop is
// core/src/model/generate.cpp's.
#include <limits>

#include "tessera/run.h"

namespace tessera {

Result<Encoder> generation_encoder(const Experiment& exp) {
  if (exp.plugins.size() != 1)
    return Status::Invalid(exp.file + ": generation needs exactly one plugin, the tokenizer of the model's text "
                           "(plugins: [{name: text, options: {...}}]); the experiment has " +
                           std::to_string(exp.plugins.size()));
  const PluginConfig& pc = exp.plugins[0];
  Result<std::shared_ptr<const Plugin>> p = Plugin::load(pc.file);
  if (!p.ok()) return p.status();
  if ((*p)->input_kind() != TSR_INPUT_TEXT)
    return Status::Invalid("plugin " + pc.name + " reads files, not text: generation needs a plugin that turns text "
                           "into token ids and back (e.g. text)");
  Result<Encoder> e = Encoder::create(*p, pc.options);
  if (!e.ok()) return e.status();
  const tsr_encoder_info& info = e->info();
  if (info.rows_kind != TSR_ROWS_IDS)
    return Status::Invalid("plugin " + pc.name + " gives feature rows: generation needs token ids");
  const int64_t V = exp.model.stem.vocab_size;
  if (info.vocab_size != V)
    return Status::Invalid("plugin " + pc.name + "'s vocabulary has " + std::to_string(info.vocab_size) +
                           " ids but model.stem.vocab_size is " + std::to_string(V) +
                           ": generation needs them equal, so that every prompt id is the model's and every id the "
                           "model generates has a text (give the model its tokenizer's vocabulary size)");
  return e;
}

GenerateOptions generate_options(const GenerateConfig& c) {
  GenerateOptions o;
  o.max_new_tokens = c.max_new_tokens;
  o.temperature = c.temperature;
  o.top_k = c.top_k;
  o.top_p = c.top_p;
  o.repetition_penalty = c.repetition_penalty;
  o.seed = static_cast<uint64_t>(c.seed);
  o.stop_strings = c.stop;
  for (int64_t id : c.stop_ids)
    if (id <= std::numeric_limits<int32_t>::max()) o.stop_ids.push_back(static_cast<int32_t>(id));  // else never made
  return o;
}

}  // namespace tessera
