// Training checkpoints that survive `kill -9` at any moment and a disk that fills during a write:
// the newest complete checkpoint is never lost, and resuming from it gives bit-identical state.
//
//   Checkpoint c;
//   c.step = 123;
//   c.weights = master;                     // Parameters, under their parameter names
//   c.optimizer = optimizer.state();        // {"step", ...}, {"adamw.m.stem.embed", ...}, ...
//   c.config_hash = config_hash;            // of the config the run was started with
//   c.state_json = trainer_state;           // the trainer's JSON: generators, data position, ...
//   Status s = write_checkpoint(run + "/checkpoints", c, /*keep=*/3);
//
//   Result<Checkpoint> r = read_checkpoint(run + "/checkpoints");   // `tessera train --resume`
//   if (r.ok() && !r->warning.empty()) { /* fell back past a broken checkpoint: tell the user */ }
//   if (r.ok()) TSR_RETURN_IF_ERROR(check_config_hash(*r, config_hash));
//
// Layout of a checkpoint folder (CKPT_DIR):
//   step-000123/weights.safetensors    the weights under their parameter names: usable as they
//                                      are as model.weights.file (`tessera run`)
//   step-000123/optimizer.safetensors  the optimizer's tensors, in the order given
//   step-000123/state.json             format, version, step, config_hash, each file's size and
//                                      FNV-1a-64 checksum, "state_fnv1a" (below), then "trainer": the
//                                      trainer's JSON exactly as given
//   latest                             "step-000123\n": the newest complete checkpoint
// Both safetensors files carry __metadata__ {"format": "tessera.checkpoint", "step": "123",
// "config_hash": ...}, so a weights file copied elsewhere still says where it came from.
// state_fnv1a is the checksum of state.json's own text with that value written as 16 zeros, so a
// torn or altered state.json is caught too.
// Folders whose names start with '.' are temporary: a write in progress, or one a killed process
// left behind (the next write removes those of processes no longer running).
//
// Thread-safety: one writer per CKPT_DIR at a time; reading is safe while nothing writes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/parameters.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

namespace tessera {

struct Checkpoint {
  int64_t step = 0;  // optimizer steps taken; names the folder
  // Tensors in f32, bf16, f16, i32, i64 or u8 (what safetensors reading loads back), any strides.
  // Read back as owned, contiguous, writable copies in the same dtype and order.
  Parameters weights;
  std::vector<std::pair<std::string, Tensor>> optimizer;
  std::string config_hash;  // any UTF-8 text; check_config_hash compares it
  // One JSON value (random generator states, data position, epoch, metrics so far), stored and
  // read back byte for byte; empty for none.
  std::string state_json;

  // Set by the readers; write_checkpoint ignores them.
  std::string path;     // the step folder read
  std::string warning;  // why read_checkpoint did not use the folder `latest` names; empty if it did
};

// "step-000123": six digits at least, more for steps past 999999.
std::string checkpoint_folder_name(int64_t step);

// Writes c as CKPT_DIR/step-NNNNNN (creating CKPT_DIR if needed): every file into a temporary
// folder and fsync'ed, the folder fsync'ed and renamed into place (atomically swapped with an
// existing folder of the same step), CKPT_DIR fsync'ed, then `latest` replaced atomically; only
// then are older step folders removed, so that the newest `keep` (>= 1) at or below c.step
// remain. Folders of later steps (left by a run resumed from an earlier checkpoint) are kept.
// A failure before `latest` is replaced leaves the previous checkpoint as it was and removes the
// temporary folder; the status names the file, the operating system's reason and the sizes
// involved. A failure after it (removing old folders) says the new checkpoint is complete.
Status write_checkpoint(const std::string& dir, const Checkpoint& c, int keep);

// The checkpoint `latest` names, every file's size and FNV-1a-64 checksum verified. When `latest` is
// missing, unreadable or names a torn, corrupt or missing folder, the newest valid step folder
// instead, with `warning` saying what was wrong and which checkpoint was used; an error naming
// every problem when no folder is valid, and not_found when there is no checkpoint at all.
Result<Checkpoint> read_checkpoint(const std::string& dir);

// One step folder, verified the same way; `latest` plays no part.
Result<Checkpoint> read_checkpoint_at(const std::string& step_dir);

// Refuses to resume under another config, naming both hashes.
Status check_config_hash(const Checkpoint& c, const std::string& current_hash);

}  // namespace tessera
