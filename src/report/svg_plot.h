// Dependency-free SVG charts for run reports: line charts (loss curves) and heatmaps (expert
// load per step). Output is a self-contained 800x500 SVG string; writing it to disk is the
// caller's business. The tick and escaping helpers are public so that tests can check them.
#pragma once
#include <span>
#include <string>
#include <vector>

namespace bagualu::report {

struct Series {
    std::string name;
    std::string color;  // any SVG colour; empty picks one from a fixed palette of 10 (series k
                        // gets colour k % 10, dashed from the 11th series on)
    std::vector<double> x, y;  // same length; points with a non-finite coordinate are skipped
};

// A line chart of `series` with nice-valued ticks, a grid and a legend (one entry per series,
// top to bottom in order). With `log_y`, points with
// y <= 0 are skipped too. Empty input gives empty axes marked "no data"; an isolated point is
// drawn as a dot.
std::string line_chart_svg(const std::string& title, const std::string& xlabel,
                           const std::string& ylabel, std::span<const Series> series,
                           bool log_y = false);

// A heatmap of rows[row][col] (rows may be ragged; missing and non-finite cells are grey), one
// labelled row per entry of `row_labels` (row indices when empty), columns labelled by index, and
// a colour bar titled `value_label`. Each cell carries a hover tooltip with its value.
std::string heatmap_svg(const std::string& title, const std::string& xlabel,
                        const std::string& ylabel, const std::vector<std::vector<double>>& rows,
                        std::span<const std::string> row_labels = {},
                        const std::string& value_label          = "");

// Axis ticks: evenly spaced values with a step of 1, 2 or 5 times a power of ten.
struct Ticks {
    double lo, hi;               // the axis range: [lo, hi] covers the data and ends on ticks
    double step;                 // 0 for log axes
    std::vector<double> values;  // ascending, inside [lo, hi]
};
// Linear ticks covering [lo, hi] with about `target` intervals; lo == hi is widened.
Ticks nice_ticks(double lo, double hi, int target = 6);
// Log-scale ticks for positive lo <= hi: powers of ten, plus 2x and 5x when the range is short.
// lo and hi of the result are powers of ten (or 2x/5x) around the data.
Ticks log_ticks(double lo, double hi);
// A tick label with no more digits than `step` needs ("0.25", "1500", "1e-06").
std::string format_tick(double value, double step);
// Text safe inside SVG/XML elements and attribute values.
std::string escape_xml(const std::string& text);

}  // namespace bagualu::report
