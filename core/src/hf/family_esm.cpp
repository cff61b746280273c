// ESM-2 folders: rotary positions, token-dropout rescaling, masked-LM head; the protein plugin
// over ESM-2's alphabet, which vocab.txt must list in order.
#include <fstream>

#include "import.h"

namespace tessera::hf::imp {

bool read_esm(Build& b) {
  Ctx& c = b.c;
  const Json& J = b.J;
  const std::string& cfg_path = b.cfg_path;
  Folder& out = b.out;
  ModelConfig& m = b.m;
  std::set<std::string>& ignorable = b.ignorable;
  std::vector<std::string>& ignorable_prefixes = b.ignorable_prefixes;
  auto& po = b.out.plugin_options;
  bool ok = b.common(NormPlacement::pre, "layer_norm_eps", 1e-12);
  const std::string p = b.base_prefix("embeddings.word_embeddings.weight");
  m.activation =
      Activation::gelu_erf;  // ESM's feed-forward and LM head use erf GELU whatever hidden_act says
  if (J.s("position_embedding_type", "absolute") != "rotary")
    c.err(cfg_path + ": position_embedding_type \"" + J.s("position_embedding_type", "absolute") +
          "\" is not implemented (Tessera runs ESM-2, whose positions are rotary)");
  if (J.b("is_folding_model", false)) c.err(cfg_path + ": ESMFold is not implemented");
  m.d_ff = J.i("intermediate_size", std::nullopt, 1, bound::kFf);
  m.final_norm = J.b("emb_layer_norm_after", true);
  m.positions.kind = PositionKind::rotary;
  m.positions.rotary_dims = m.d_k;
  m.positions.rotary_style = RotaryStyle::half;
  m.positions.base = 10000.0;
  m.positions.max_len = J.i("max_position_embeddings", 1026, 1, bound::kPositions);
  m.stem.kind = StemKind::tokens;
  m.stem.vocab_size = J.i("vocab_size", std::nullopt, 1, bound::kVocab);
  m.stem.token_dropout = J.b("token_dropout", false);
  m.stem.mask_id = J.i("mask_token_id", 32, 0, bound::kVocab - 1);
  m.stem.norm = J.b("emb_layer_norm_before", false);
  for (int64_t l = 0; l < m.n_layers && ok; ++l)
    ignorable.insert(p + "encoder.layer." + std::to_string(l) + ".attention.self.rotary_embeddings.inv_freq");
  ignorable.insert(p + "embeddings.position_ids");
  ignorable.insert(p + "embeddings.position_embeddings.weight");  // made even for rotary models, never used
  if (b.has_prefix(p + "contact_head.")) {
    ignorable_prefixes.push_back(p + "contact_head.");
    out.notes.push_back("contact_head is not used; export attention maps (task.attention) instead");
  }
  if (b.has_tensor("lm_head.bias")) {
    m.head.transform = true;
    b.lm_head(true);
  } else {
    m.head.kind = HeadKind::pool;
    m.head.pool = PoolKind::mean;
  }
  // The protein plugin: EsmTokenizer's rules (its default, written out so that the folder alone
  // decides), over ESM-2's alphabet, which vocab.txt must list in the plugin's id order.
  out.plugin = "protein";
  po.emplace_back("tokenizer", "esm");
  po.emplace_back("uppercase", "false");  // EsmTokenizer has no lower-case tokens
  const std::string vocab = b.tok_file("vocab.txt", "the ESM alphabet");
  std::error_code ec;
  const uintmax_t vocab_bytes = vocab.empty() ? 0 : fs::file_size(vocab, ec);
  constexpr uintmax_t kMaxVocabBytes = 1 << 20;  // ESM-2's alphabet is 33 short lines
  if (!vocab.empty() && (ec || vocab_bytes > kMaxVocabBytes)) {
    c.err(vocab + ": " +
          (ec ? "cannot be read: " + ec.message()
              : std::to_string(vocab_bytes) + " bytes is more than the " + std::to_string(kMaxVocabBytes) +
                    "-byte limit for an ESM alphabet"));
  } else if (!vocab.empty()) {
    std::ifstream in(vocab);
    // As EsmTokenizer reads it: one token a line, stripped; trailing blank lines aside.
    std::vector<std::string> tokens;
    const char* const blank = " \t\r\v\f";
    for (std::string line; std::getline(in, line);) {
      const size_t first = line.find_first_not_of(blank);
      tokens.push_back(
          first == std::string::npos ? "" : line.substr(first, line.find_last_not_of(blank) + 1 - first));
    }
    while (!tokens.empty() && tokens.back().empty()) tokens.pop_back();
    if (static_cast<int64_t>(tokens.size()) != m.stem.vocab_size && c.bad_values == 0)
      c.err(vocab + ": " + std::to_string(tokens.size()) + " tokens, but config.json's vocab_size is " +
            std::to_string(m.stem.vocab_size) + " (the protein plugin gives ESM-2's 33-token alphabet)");
    for (size_t i = 0; i < tokens.size() && i < esm2_alphabet().size(); ++i)
      if (tokens[i] != esm2_alphabet()[i]) {
        c.err(vocab + ": token " + std::to_string(i) + " is \"" + tokens[i] +
                  "\" where ESM-2's alphabet has \"" + esm2_alphabet()[i] + "\"",
              "the protein plugin gives ESM-2's ids (<cls> <pad> <eos> <unk> L A G V ...); a model with "
              "another "
              "vocabulary needs its own tokenizer");
        break;
      }
  }
  return ok;
}

}  // namespace tessera::hf::imp
