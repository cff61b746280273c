// loss.png, metric.png, confusion.png and report.md for a training run folder. The plots are
// drawn with cairo (its toy text API: the system's sans-serif font through fontconfig), from
// metrics.jsonl, so a resumed run's pictures show exactly the steps its metrics file keeps.
#include "train/report.h"

#include <cairo.h>
#include <fontconfig/fontconfig.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessera/fileio.h"

namespace tessera::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Series {
  std::string name;
  double r, g, b;
  bool points = false;  // dots at the evaluations, joined
  std::vector<std::pair<double, double>> xy;
};

std::string num(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) std::snprintf(buf, sizeof buf, "%.1e", v);
  else std::snprintf(buf, sizeof buf, "%g", std::round(v * 1e4) / 1e4);
  return buf;
}

// About five round ticks covering [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  const double span = hi > lo ? hi - lo : 1.0;
  const double raw = span / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) t.push_back(std::fabs(v) < 1e-12 * step ? 0 : v);
  return t;
}

void text(cairo_t* cr, double x, double y, const std::string& s, double size, double align_x, double align_y,
          bool bold = false) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - e.width * align_x - e.x_bearing, y - e.height * align_y - e.y_bearing);
  cairo_show_text(cr, s.c_str());
}

Status save(cairo_surface_t* s, const std::string& path) {
  const std::string tmp = path + ".tmp";
  const cairo_status_t st = cairo_surface_write_to_png(s, tmp.c_str());
  if (st != CAIRO_STATUS_SUCCESS) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return Status::IoError("cannot write " + path + ": " + cairo_status_to_string(st));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::IoError("cannot write " + path + ": " + ec.message());
  return Status::Ok();
}

// A line chart of `series` against the step.
Status line_chart(const std::string& path, const std::string& title, const std::string& y_label,
                  const std::vector<Series>& series) {
  const int W = 800, H = 500;
  const double left = 80, right = 30, top = 50, bottom = 60;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.xy) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x0 > x1) return Status::Ok();  // nothing to draw yet
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  cairo_surface_t* surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, W, H);
  cairo_t* cr = cairo_create(surf);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (W - left - right); };
  auto py = [&](double y) { return H - bottom - (y - y0) / (y1 - y0) * (H - top - bottom); };
  cairo_set_line_width(cr, 1);
  for (double t : ticks(y0, y1)) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, left, std::round(py(t)) + 0.5);
    cairo_line_to(cr, W - right, std::round(py(t)) + 0.5);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text(cr, left - 6, py(t), num(t), 12, 1, 0.5);
  }
  for (double t : ticks(x0, x1)) {
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text(cr, px(t), H - bottom + 8, num(t), 12, 0.5, 0);
  }
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_rectangle(cr, left + 0.5, top + 0.5, W - left - right - 1, H - top - bottom - 1);
  cairo_stroke(cr);
  text(cr, W / 2.0, 18, title, 16, 0.5, 0, true);
  text(cr, (left + W - right) / 2, H - 22, "step", 13, 0.5, 0);
  cairo_save(cr);
  cairo_translate(cr, 18, (top + H - bottom) / 2);
  cairo_rotate(cr, -M_PI / 2);
  text(cr, 0, 0, y_label, 13, 0.5, 0.5);
  cairo_restore(cr);
  double legend_y = top + 16;
  for (const Series& s : series) {
    if (s.xy.empty()) continue;
    cairo_set_source_rgb(cr, s.r, s.g, s.b);
    cairo_set_line_width(cr, s.points ? 2 : 1.5);
    bool first = true;
    for (auto [x, y] : s.xy) {
      if (!std::isfinite(y)) continue;
      if (first) cairo_move_to(cr, px(x), py(y));
      else cairo_line_to(cr, px(x), py(y));
      first = false;
    }
    cairo_stroke(cr);
    if (s.points)
      for (auto [x, y] : s.xy) {
        cairo_arc(cr, px(x), py(y), 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
    cairo_move_to(cr, W - right - 170, legend_y);
    cairo_line_to(cr, W - right - 145, legend_y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text(cr, W - right - 138, legend_y, s.name, 12, 0, 0.5);
    legend_y += 18;
  }
  cairo_destroy(cr);
  const Status st = save(surf, path);
  cairo_surface_destroy(surf);
  return st;
}

// The confusion matrix: each cell shaded by its share of the true class's items, with its count.
Status confusion_chart(const std::string& path, const std::vector<std::string>& classes,
                       const std::vector<std::vector<int64_t>>& m) {
  const int K = static_cast<int>(m.size());
  if (K == 0) return Status::Ok();
  const double cell = std::clamp(600.0 / K, 14.0, 60.0), label = 130, top = 60;
  const int W = std::max(static_cast<int>(label + K * cell + 30), 420), H = static_cast<int>(top + K * cell + label);
  cairo_surface_t* surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, W, H);
  cairo_t* cr = cairo_create(surf);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  text(cr, W / 2.0, 14, "confusion matrix", 15, 0.5, 0, true);
  text(cr, W / 2.0, 36, "rows: the true class; columns: the predicted one", 11, 0.5, 0);
  const double font = std::min(12.0, cell * 0.4);
  for (int t = 0; t < K; ++t) {
    int64_t row = 0;
    for (int64_t v : m[static_cast<size_t>(t)]) row += v;
    for (int p = 0; p < K; ++p) {
      const int64_t v = m[static_cast<size_t>(t)][static_cast<size_t>(p)];
      const double share = row ? static_cast<double>(v) / static_cast<double>(row) : 0;
      const double x = label + p * cell, y = top + t * cell;
      cairo_set_source_rgb(cr, 1 - 0.85 * share, 1 - 0.6 * share, 1 - 0.25 * share);
      cairo_rectangle(cr, x, y, cell, cell);
      cairo_fill(cr);
      if (cell >= 22) {
        const double shade = share > 0.5 ? 1.0 : 0.1;
        cairo_set_source_rgb(cr, shade, shade, shade);
        text(cr, x + cell / 2, y + cell / 2, std::to_string(v), font, 0.5, 0.5);
      }
    }
  }
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  for (int k = 0; k < K; ++k) {
    const std::string name = k < static_cast<int>(classes.size()) ? classes[static_cast<size_t>(k)] : std::to_string(k);
    text(cr, label - 6, top + (k + 0.5) * cell, name, font, 1, 0.5);
    cairo_save(cr);
    cairo_translate(cr, label + (k + 0.5) * cell, top + K * cell + 6);
    cairo_rotate(cr, M_PI / 2);
    text(cr, 0, 0, name, font, 0, 0.5);
    cairo_restore(cr);
  }
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, label + 0.5, top + 0.5, K * cell, K * cell);
  cairo_stroke(cr);
  cairo_destroy(cr);
  const Status st = save(surf, path);
  cairo_surface_destroy(surf);
  return st;
}

}  // namespace

namespace {

// Cairo's font caches and fontconfig's configuration, built on the first text drawn, are given
// back once the plots are written (they are built again, in milliseconds, for the next ones): a
// training run keeps no font state, and leak checkers see none.
struct FontState {
  FontState() = default;
  FontState(const FontState&) = delete;
  FontState& operator=(const FontState&) = delete;
  ~FontState() {
    cairo_debug_reset_static_data();
    FcFini();
  }
};

}  // namespace

Status write_plots(const std::string& dir, const std::vector<std::string>& classes,
                   const std::vector<std::vector<int64_t>>& confusion, const std::vector<HeadTask>& tasks) {
  const FontState fonts;
  Series train{"training loss", 0.12, 0.47, 0.71, false, {}}, val{"validation loss", 0.85, 0.37, 0.0, true, {}};
  Series metric{"validation", 0.17, 0.63, 0.17, true, {}};
  static const double kTaskColours[][3] = {{0.84, 0.15, 0.16}, {0.12, 0.47, 0.71}, {0.58, 0.40, 0.74},
                                           {0.55, 0.34, 0.29}, {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}};
  std::vector<Series> per_task;
  for (size_t t = 0; t < tasks.size(); ++t) {
    const double* rgb = kTaskColours[t % 6];
    per_task.push_back({tasks[t].name, rgb[0], rgb[1], rgb[2], true, {}});  // short: the legend is 170 px
  }
  std::string metric_name;
  std::ifstream f(fs::path(dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step")) continue;
    const double step = j["step"].get<double>();
    if (j.contains("loss") && j["loss"].is_number()) train.xy.emplace_back(step, j["loss"].get<double>());
    if (j.contains("eval") && j["eval"].is_object()) {
      const json& e = j["eval"];
      if (e.contains("loss")) val.xy.emplace_back(step, e["loss"].get<double>());
      for (const char* k : {"accuracy", "bits_per_token"})
        if (e.contains(k)) {
          metric_name = k;
          metric.xy.emplace_back(step, e[k].get<double>() * (metric_name == "accuracy" ? 100.0 : 1.0));
          break;  // a masked LM has both: its accuracy is plotted
        }
      for (size_t t = 0; t < tasks.size(); ++t)
        if (e.contains("tasks") && e["tasks"].contains(tasks[t].name))
          per_task[t].xy.emplace_back(step, e["tasks"][tasks[t].name].value("accuracy", 0.0) * 100.0);
    }
  }
  TSR_RETURN_IF_ERROR(line_chart((fs::path(dir) / "loss.png").string(), "loss", "cross-entropy (nats)", {train, val}));
  if (!metric_name.empty()) {
    metric.name = metric_name == "accuracy" ? "validation accuracy" : "validation bits/token";
    std::vector<Series> lines{metric};
    if (!per_task.empty()) {  // each task's accuracy over its own items (the tasks the set has)
      lines.clear();
      for (const Series& t : per_task)
        if (!t.xy.empty()) lines.push_back(t);
    }
    TSR_RETURN_IF_ERROR(line_chart((fs::path(dir) / "metric.png").string(),
                                   metric_name != "accuracy" ? "bits per token"
                                   : per_task.empty()        ? "accuracy"
                                                             : "validation accuracy of each task, over its own items",
                                   metric_name == "accuracy" ? "accuracy (%)" : "bits per token", lines));
  }
  if (!confusion.empty()) TSR_RETURN_IF_ERROR(confusion_chart((fs::path(dir) / "confusion.png").string(), classes, confusion));
  for (const HeadTask& t : tasks) {
    if (confusion.empty()) break;
    const size_t k = t.labels.size(), f = static_cast<size_t>(t.first);
    std::vector<std::vector<int64_t>> block(k, std::vector<int64_t>(k, 0));
    int64_t items = 0;
    for (size_t a = 0; a < k; ++a)
      for (size_t b = 0; b < k; ++b) items += block[a][b] = confusion[f + a][f + b];
    if (items == 0) continue;  // a task the set has no items of
    TSR_RETURN_IF_ERROR(confusion_chart((fs::path(dir) / ("confusion_" + t.name + ".png")).string(), t.labels, block));
  }
  return Status::Ok();
}

std::string shortest(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

Status write_report(const std::string& dir, const std::string& experiment_file, const std::string& model_line,
                    const TrainSummary& s, int64_t parameters) {
  std::ostringstream r;
  auto pct = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f %%", 100 * v);
    return std::string(b);
  };
  auto fixed = [](double v, int d) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", d, v);
    return std::string(b);
  };
  auto figures = [&](const EvalResult& e) {
    std::string t = "loss " + fixed(e.loss, 4);
    const bool masked = e.accuracy >= 0 && e.bits_per_token >= 0;  // a masked LM: accuracy at the masked rows
    if (e.accuracy >= 0) t += ", accuracy " + pct(e.accuracy) + (masked ? "" : ", macro-F1 " + fixed(e.macro_f1, 4));
    if (e.bits_per_token >= 0) t += ", " + fixed(e.bits_per_token, 4) + " bits per token";
    return t + " (" + std::to_string(e.counted) +
           (masked ? " masked rows)" : e.accuracy >= 0 ? " items)" : " tokens)");
  };
  r << "# Training run: " << fs::path(experiment_file).filename().string() << "\n\n";
  r << "- experiment: `" << experiment_file << "`\n";
  r << "- model: " << model_line << ", " << parameters << " parameters\n";
  r << "- " << s.steps << " steps" << (s.steps_resumed ? " (" + std::to_string(s.steps_resumed) + " before a resume)" : "")
    << (s.budget_minutes > 0 ? " (what a budget of " + shortest(s.budget_minutes) + " minutes held, train.max_minutes)" : "")
    << ", " << s.examples << " training examples per epoch, " << fixed(s.seconds, 1) << " s"
    << (s.stopped_early ? "; stopped early (train.patience)" : "") << "\n";
  auto task_lines = [&](const EvalResult& e) {
    std::string t;
    for (const TaskEval& k : e.tasks)
      t += "  - task " + k.name + ": loss " + fixed(k.loss, 4) + ", accuracy " + pct(k.accuracy) + ", macro-F1 " +
           fixed(k.macro_f1, 4) + " (" + std::to_string(k.counted) + " items)\n";
    return t;
  };
  std::string by;  // what picked it, where not the default's accuracy or loss
  if (s.metric == TrainMetric::macro_f1) by = ", by macro-F1";
  if (s.metric == TrainMetric::task_mean)
    by = ", by the mean of the tasks' accuracies: " + pct(metric_value(TrainMetric::task_mean, s.best));
  r << "- best validation (step " << s.best_step << by << "): " << figures(s.best) << "\n" << task_lines(s.best);
  if (s.test.counted) r << "- test, with the best weights: " << figures(s.test) << "\n" << task_lines(s.test);
  r << "- best weights: `best.safetensors` (run them with `model.weights.file`)\n\n";
  r << "![loss](loss.png)\n\n";
  if (fs::exists(fs::path(dir) / "metric.png")) r << "![validation metric](metric.png)\n\n";
  const EvalResult& e = s.test.counted ? s.test : s.best;
  if (!e.confusion.empty()) {
    r << "## Per class (" << (s.test.counted ? "test" : "validation") << ")\n\n";
    r << "| class | precision | recall | F1 | support |\n|---|---|---|---|---|\n";
    const size_t K = e.confusion.size();
    for (size_t k = 0; k < K; ++k) {
      int64_t support = 0, predicted = 0;
      for (size_t j = 0; j < K; ++j) support += e.confusion[k][j], predicted += e.confusion[j][k];
      const int64_t tp = e.confusion[k][k];
      const double p = predicted ? static_cast<double>(tp) / static_cast<double>(predicted) : 0;
      const double rc = support ? static_cast<double>(tp) / static_cast<double>(support) : 0;
      const double f1 = tp ? 2.0 * static_cast<double>(tp) / static_cast<double>(support + predicted) : 0;
      r << "| " << (k < s.classes.size() ? s.classes[k] : std::to_string(k)) << " | " << fixed(p, 4) << " | "
        << fixed(rc, 4) << " | " << fixed(f1, 4) << " | " << support << " |\n";
    }
    r << "\n![confusion matrix](confusion.png)\n";
    for (const TaskEval& k : e.tasks)
      if (fs::exists(fs::path(dir) / ("confusion_" + k.name + ".png")))
        r << "\n![confusion matrix of task " << k.name << "](confusion_" << k.name << ".png)\n";
  }
  return write_file_atomic((fs::path(dir) / "report.md").string(), r.str());
}

}  // namespace tessera::report
