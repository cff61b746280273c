// The run folder's pictures and summary: loss.png, metric.png and confusion.png (cairo), drawn
// from metrics.jsonl, and report.md. Private to the trainer.
#pragma once

#include <string>
#include <vector>

#include "tessera/status.h"
#include "tessera/train.h"

namespace tessera::report {

// loss.png and metric.png from DIR/metrics.jsonl (the training loss of every logged step, and every
// evaluation), and, for a classifier, confusion.png of `confusion` (rows: true class) with the
// class names. Written atomically; a run with no evaluation yet gets loss.png alone.
// With model.head.tasks, metric.png has a line per task, and each task gets
// confusion_<task>.png of its own block of `confusion` (its items are predicted within it).
Status write_plots(const std::string& dir, const std::vector<std::string>& classes,
                   const std::vector<std::vector<int64_t>>& confusion, const std::vector<HeadTask>& tasks = {});

// A number as printf's %g writes it: 19.5 -> "19.5", 0.04 -> "0.04" (minutes, shares).
std::string shortest(double v);

// DIR/report.md: what was trained on what, the best evaluation, the test result with its per-class
// table, and the plots.
Status write_report(const std::string& dir, const std::string& experiment_file, const std::string& model_line,
                    const TrainSummary& summary, int64_t parameters);

}  // namespace tessera::report
