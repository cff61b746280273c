// GPT-2 folders: pre-LN decoder, Conv1D weights, tied or untied LM head; byte-level BPE text.
#include "import.h"

namespace tessera::hf::imp {

bool read_gpt2(Build& b) {
  Ctx& c = b.c;
  const Json& J = b.J;
  const std::string& cfg_path = b.cfg_path;
  Folder& out = b.out;
  ModelConfig& m = b.m;
  const int64_t C = b.C;
  std::set<std::string>& ignorable = b.ignorable;
  auto& po = b.out.plugin_options;
  bool ok = b.common(NormPlacement::pre, "layer_norm_epsilon", 1e-5);
  const std::string p = b.base_prefix("wte.weight");
  if (J.b("scale_attn_by_inverse_layer_idx", false))
    c.err(cfg_path + ": scale_attn_by_inverse_layer_idx is not implemented");
  if (!J.b("scale_attn_weights", true)) c.err(cfg_path + ": scale_attn_weights false is not implemented");
  if (J.b("add_cross_attention", false)) c.err(cfg_path + ": add_cross_attention is not implemented");
  ok = activation_of(c, cfg_path, "activation_function", J.s("activation_function", "gelu_new"),
                     &m.activation) &&
       ok;
  m.arch = Arch::decoder;
  m.causal = true;
  m.final_norm = true;
  m.d_ff = J.i("n_inner", 4 * C, 1, bound::kFf);
  m.positions.kind = PositionKind::learned;
  m.positions.max_len = J.i("n_positions", 1024, 1, bound::kPositions);
  m.stem.kind = StemKind::tokens;
  m.stem.vocab_size = J.i("vocab_size", std::nullopt, 1, bound::kVocab);
  for (int64_t l = 0; l < m.n_layers && ok; ++l) {
    const std::string e = p + "h." + std::to_string(l) + ".";
    ignorable.insert(e + "attn.bias");  // the causal mask buffer of older checkpoints
    ignorable.insert(e + "attn.masked_bias");
  }
  b.lm_head(false);
  out.plugin = "text";
  po.emplace_back("tokenizer", "bpe");
  const std::string v = b.tok_file("vocab.json", "GPT-2's byte-level BPE vocabulary the text plugin reads");
  const std::string mg = b.tok_file("merges.txt", "GPT-2's BPE merges the text plugin reads");
  if (!v.empty()) po.emplace_back("vocab", v);
  if (!mg.empty()) po.emplace_back("merges", mg);
  po.emplace_back("max_length", std::to_string(m.positions.max_len));
  return ok;
}

}  // namespace tessera::hf::imp
