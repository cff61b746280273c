// How a Model is put together: the layers Model::build makes from the parameters, and the
// three parts of the forward pass that read like the diagram — stem, blocks, head — each a function
// of (layers, inputs) in its own file. Private to core/src/model.
#pragma once

#include <string>
#include <vector>

#include "layers.h"
#include "tessera/model.h"

namespace tessera {

namespace model {
struct Block {
  AttentionLayer attn;
  Tensor ln1_g, ln1_b, ln2_g, ln2_b;
  Linear ffn1, ffn2;  // ffn1 has the activation fused
};
}  // namespace model

// What forward() runs, built once from the parameters.
struct Model::Layers {
  Tensor embed;      // (V, C)
  Tensor type_embed; // (token_types, C)
  Tensor stem_g, stem_b;  // stem.norm
  Tensor dist;       // (C)
  Linear stem_proj;  // (F, C)
  Tensor cls;        // (C)
  Tensor modality;   // (modalities, C)
  Tensor pos;        // (max_len, C): learned or sinusoidal
  std::vector<model::Block> blocks;
  Tensor final_g, final_b;
  Linear head;       // classifier (C, n_classes) or LM (C, V)
  Linear pooler;     // (C, C), tanh applied after
  Tensor head_g, head_b;  // head.norm
  Linear transform;  // (C, C) with the model's activation fused
  Tensor transform_g, transform_b;
};

namespace model {

// layout.cpp: the batch checked against the config, and resolved into who attends to whom.
Status check_batch(const ModelConfig& c, const Batch& batch);
// CLS (and distillation) rows a features or mixed stem prepends to every batch row: 0 when the
// batch's roles say where they are.
int64_t prepended_rows(const ModelConfig& c, const Batch& batch);
// Each row's sequence and position; with a KV cache, past[b] rows of sequence b come first.
Status row_layout(const ModelConfig& c, const Batch& batch, int64_t extra, const std::vector<int64_t>& past,
                  RowLayout* lay);
// Rows of one batch row that belong to sequence `s`, in order.
std::vector<int64_t> rows_of(const RowLayout& lay, int64_t b, int32_t s);

// stem.cpp: token ids and/or feature rows -> x (B, T, C), positions added, stem.norm applied.
// x and h are the pass's stream and scratch buffers (B, T, C); the stem may swap them.
Status stem_forward(const ModelConfig& c, const Model::Layers& L, const Exec& ex, const Batch& batch,
                    const RowLayout& lay, int64_t extra, Tensor& x, Tensor& h);

// block.cpp: one transformer block on the stream x (B, T, C), in place; h is scratch (B, T, C).
// p names the block ("blocks.3") for captures.
Status block_forward(const ModelConfig& c, const Block& blk, const Exec& ex, const RowLayout& lay, Tensor& x,
                     Tensor& h, const Capture& cap, const std::string& p, const CacheView* cache);

// head.cpp: the final rows x (B, T, C) -> out's pooled vectors, logits and probabilities.
Status head_forward(const Model& m, const Model::Layers& L, const Exec& ex, const Batch& batch,
                    const RowLayout& lay, int64_t extra, const Tensor& x, const ForwardOptions& opt,
                    const Capture& cap, Outputs* out);

}  // namespace model
}  // namespace tessera
