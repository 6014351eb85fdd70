// SVG line charts and heatmaps built as strings. Layout is fixed (800x500, sans-serif, margins
// sized for the labels); data are mapped to pixels through Ticks so that axes always end on
// tick values. Text widths are estimated, not measured: about 0.6 em per character.
#include "report/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace bagualu::report {

namespace {

constexpr double kWidth                        = 800;
constexpr double kHeight                       = 500;
constexpr double kCharWidth                    = 7;  // estimated width of one 12px character
constexpr std::size_t kMaxLabelChars           = 28;
constexpr std::array<const char*, 10> kPalette = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                  "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                  "#bcbd22", "#17becf"};
constexpr std::array<const char*, 3> kDashes   = {"6 3", "2 3", "8 3 2 3"};

// Sequential colour scale (viridis), evenly spaced stops from low to high.
constexpr std::array<std::array<int, 3>, 9> kScale = {{{0x44, 0x01, 0x54},
                                                       {0x47, 0x2d, 0x7b},
                                                       {0x3b, 0x52, 0x8b},
                                                       {0x2c, 0x72, 0x8e},
                                                       {0x21, 0x91, 0x8c},
                                                       {0x28, 0xae, 0x80},
                                                       {0x5e, 0xc9, 0x62},
                                                       {0xad, 0xdc, 0x30},
                                                       {0xfd, 0xe7, 0x25}}};

std::string truncate_label(const std::string& s) {
    if (s.size() <= kMaxLabelChars) return s;
    std::size_t cut = kMaxLabelChars - 1;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;  // UTF-8
    return s.substr(0, cut) + "\u2026";
}

double text_width(const std::string& s) {
    return kCharWidth * static_cast<double>(std::min(s.size(), kMaxLabelChars));
}

std::string scale_color(double t) {
    t                  = std::clamp(t, 0.0, 1.0) * static_cast<double>(kScale.size() - 1);
    const auto i       = std::min(static_cast<std::size_t>(t), kScale.size() - 2);
    const double frac  = t - static_cast<double>(i);
    const auto channel = [&](std::size_t c) {
        return static_cast<int>(
            std::lround(kScale[i][c] + frac * (kScale[i + 1][c] - kScale[i][c])));
    };
    return fmt::format("#{:02x}{:02x}{:02x}", channel(0), channel(1), channel(2));
}

// A string of SVG elements with the chart frame around them.
class Canvas {
   public:
    Canvas() {
        out_ += fmt::format(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
            "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\">\n"
            "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
            kWidth, kHeight);
    }
    void raw(const std::string& s) { out_ += s; }
    void text(double x, double y, const std::string& s, const std::string& attrs = "") {
        out_ += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" {}>{}</text>\n", x, y, attrs,
                            escape_xml(s));
    }
    void line(double x1, double y1, double x2, double y2, const std::string& stroke,
              double width = 1, const std::string& extra_attrs = "") {
        out_ += fmt::format(
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
            "stroke-width=\"{}\"{}/>\n",
            x1, y1, x2, y2, stroke, width, extra_attrs);
    }
    // Title centred on top, x label under the plot, y label rotated left of it.
    void labels(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                double plot_left, double plot_right, double plot_top, double plot_bottom) {
        text(kWidth / 2, 30, title, "font-size=\"18\" text-anchor=\"middle\" font-weight=\"bold\"");
        text((plot_left + plot_right) / 2, plot_bottom + 45, xlabel,
             "font-size=\"13\" text-anchor=\"middle\"");
        const double cy = (plot_top + plot_bottom) / 2;
        text(
            18, cy, ylabel,
            fmt::format(
                "font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 18 {:.1f})\"", cy));
    }
    std::string finish() {
        out_ += "</svg>\n";
        return std::move(out_);
    }

   private:
    std::string out_;
};

bool near(double a, double b, double scale) { return std::abs(a - b) <= 1e-9 * scale; }

}  // namespace

// ---- ticks and text ----

std::string escape_xml(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&apos;";
                break;
            default:
                // Control characters are not allowed in XML 1.0 text.
                if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
        }
    }
    return out;
}

Ticks nice_ticks(double lo, double hi, int target) {
    if (lo > hi) std::swap(lo, hi);
    if (!(hi > lo)) {
        const double pad = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    const double raw = (hi - lo) / std::max(target, 1);
    if (!std::isfinite(raw) || !(raw > 0)) return {lo, hi, 0, {lo, hi}};
    const double mag  = std::pow(10.0, std::floor(std::log10(raw)));
    const double f    = raw / mag;
    const double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    Ticks t{std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step, {}};
    const auto n = static_cast<long>(std::lround((t.hi - t.lo) / step));
    for (long i = 0; i <= std::min(n, 1000L); ++i) {
        const double v = std::round((t.lo + static_cast<double>(i) * step) / step) * step;
        t.values.push_back(v + 0.0);  // + 0.0 turns -0 into 0
    }
    return t;
}

Ticks log_ticks(double lo, double hi) {
    if (lo > hi) std::swap(lo, hi);
    if (!(lo > 0)) lo = hi > 0 ? hi / 10 : 1;
    if (!(hi > 0)) hi = lo * 10;
    if (!(hi > lo)) {
        lo /= 2;
        hi *= 2;
    }
    const double decades = std::log10(hi) - std::log10(lo);
    // Mantissas that get a tick, and every how many decades, by how wide the range is.
    std::vector<double> mantissas = decades > 6 ? std::vector<double>{1}
                                    : decades > 1.5
                                        ? std::vector<double>{1, 2, 5}
                                        : std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9};
    const int stride              = decades > 6 ? static_cast<int>(std::ceil(decades / 8)) : 1;
    const int k_lo                = static_cast<int>(std::floor(std::log10(lo))) - 1;
    const int k_hi                = static_cast<int>(std::ceil(std::log10(hi))) + 1;
    std::vector<double> candidates;
    for (int k = k_lo; k <= k_hi; ++k) {
        if (((k % stride) + stride) % stride != 0) continue;
        for (double m : mantissas) candidates.push_back(m * std::pow(10.0, k));
    }
    Ticks t{lo, hi, 0, {}};
    for (double c : candidates) {
        if (c <= lo || near(c, lo, c)) t.lo = c;
    }
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
        if (*it >= hi || near(*it, hi, *it)) t.hi = *it;
    }
    for (double c : candidates) {
        if ((c >= t.lo || near(c, t.lo, c)) && (c <= t.hi || near(c, t.hi, c)))
            t.values.push_back(c);
    }
    return t;
}

std::string format_tick(double value, double step) {
    if (step == 0) return fmt::format("{:g}", value);
    if (std::abs(value) < step * 1e-6) return "0";
    const double a = std::abs(value);
    if (a >= 1e7 || step < 1e-5) {
        const int digits =
            static_cast<int>(std::floor(std::log10(a)) - std::floor(std::log10(step)));
        return fmt::format("{:.{}e}", value, std::clamp(digits, 0, 15));
    }
    const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
    return fmt::format("{:.{}f}", value, decimals);
}

// ---- line chart ----

std::string line_chart_svg(const std::string& title, const std::string& xlabel,
                           const std::string& ylabel, std::span<const Series> series, bool log_y) {
    const auto usable = [&](double x, double y) {
        return std::isfinite(x) && std::isfinite(y) && (!log_y || y > 0);
    };
    double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min;
    double y_min = x_min, y_max = -x_min;
    double legend_width = 0;
    for (const Series& s : series) {
        BGL_CHECK(s.x.size() == s.y.size(), "series {} has {} x and {} y values", s.name,
                  s.x.size(), s.y.size());
        for (std::size_t i = 0; i < s.x.size(); ++i) {
            if (!usable(s.x[i], s.y[i])) continue;
            x_min = std::min(x_min, s.x[i]);
            x_max = std::max(x_max, s.x[i]);
            y_min = std::min(y_min, s.y[i]);
            y_max = std::max(y_max, s.y[i]);
        }
        legend_width = std::max(legend_width, 40 + text_width(s.name));
    }
    const bool empty = !(x_min <= x_max);
    if (empty) {
        x_min = 0;
        x_max = 1;
        y_min = log_y ? 1 : 0;
        y_max = log_y ? 10 : 1;
    }
    const Ticks xt = nice_ticks(x_min, x_max, 8);
    const Ticks yt = log_y ? log_ticks(y_min, y_max) : nice_ticks(y_min, y_max, 6);

    const double left = 75, top = 50, bottom = kHeight - 60;
    const double right = kWidth - 20 - (legend_width > 0 ? legend_width + 10 : 0);
    const auto px = [&](double x) { return left + (x - xt.lo) / (xt.hi - xt.lo) * (right - left); };
    const auto fy = [&](double y) { return log_y ? std::log10(y) : y; };
    const auto py = [&](double y) {
        return bottom - (fy(y) - fy(yt.lo)) / (fy(yt.hi) - fy(yt.lo)) * (bottom - top);
    };

    Canvas c;
    c.labels(title, xlabel, ylabel, left, right, top, bottom);
    for (double v : xt.values) {
        c.line(px(v), top, px(v), bottom, "#e6e6e6");
        c.text(px(v), bottom + 18, format_tick(v, xt.step),
               "font-size=\"12\" text-anchor=\"middle\"");
    }
    for (double v : yt.values) {
        c.line(left, py(v), right, py(v), "#e6e6e6");
        c.text(left - 8, py(v) + 4, format_tick(v, yt.step),
               "font-size=\"12\" text-anchor=\"end\"");
    }
    c.raw(fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
        "stroke=\"#333\"/>\n",
        left, top, right - left, bottom - top));
    if (empty) {
        c.text((left + right) / 2, (top + bottom) / 2, "no data",
               "font-size=\"16\" fill=\"#888\" text-anchor=\"middle\"");
    }

    for (std::size_t k = 0; k < series.size(); ++k) {
        const Series& s = series[k];
        const std::string color =
            escape_xml(s.color.empty() ? kPalette[k % kPalette.size()] : s.color);
        // Past the palette, colours repeat with a dash pattern, so that every series differs.
        const std::size_t round = s.color.empty() ? k / kPalette.size() : 0;
        const std::string dash  = round == 0 ? ""
                                             : fmt::format(" stroke-dasharray=\"{}\"",
                                                           kDashes[(round - 1) % kDashes.size()]);
        // One path; a skipped point breaks the line, and a point alone in its run is a dot.
        std::string path;
        std::vector<std::pair<double, double>> run, dots;
        std::size_t finite = 0;
        const auto end_run = [&] {
            if (run.size() == 1) dots.push_back(run[0]);
            for (std::size_t j = 0; j < run.size() && run.size() > 1; ++j) {
                path += fmt::format("{}{:.1f} {:.1f}", j == 0 ? (path.empty() ? "M" : " M") : " L",
                                    run[j].first, run[j].second);
            }
            run.clear();
        };
        for (std::size_t i = 0; i < s.x.size(); ++i) {
            if (usable(s.x[i], s.y[i])) {
                run.emplace_back(px(s.x[i]), py(s.y[i]));
                ++finite;
            } else {
                end_run();
            }
        }
        end_run();
        c.raw(fmt::format("<g>\n<title>{}</title>\n", escape_xml(s.name)));
        if (!path.empty()) {
            c.raw(
                fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
                            "stroke-linejoin=\"round\"{}/>\n",
                            path, color, dash));
        }
        if (finite <= 50) {  // sparse series (e.g. validation) get a dot on every point
            dots.clear();
            for (std::size_t i = 0; i < s.x.size(); ++i) {
                if (usable(s.x[i], s.y[i])) dots.emplace_back(px(s.x[i]), py(s.y[i]));
            }
        }
        for (const auto& [dx, dy] : dots) {
            c.raw(fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", dx, dy,
                              color));
        }
        c.raw("</g>\n");

        const double ly = top + 10 + 20 * static_cast<double>(k);
        c.line(right + 12, ly, right + 34, ly, color, 2.5, dash);
        c.text(right + 40, ly + 4, truncate_label(s.name) + (finite == 0 ? " (no data)" : ""),
               "font-size=\"12\"");
    }
    return c.finish();
}

// ---- heatmap ----

std::string heatmap_svg(const std::string& title, const std::string& xlabel,
                        const std::string& ylabel, const std::vector<std::vector<double>>& rows,
                        std::span<const std::string> row_labels, const std::string& value_label) {
    std::size_t cols = 0;
    double v_min = std::numeric_limits<double>::infinity(), v_max = -v_min;
    for (const auto& r : rows) {
        cols = std::max(cols, r.size());
        for (double v : r) {
            if (!std::isfinite(v)) continue;
            v_min = std::min(v_min, v);
            v_max = std::max(v_max, v);
        }
    }
    const auto row_label = [&](std::size_t i) {
        return i < row_labels.size() ? truncate_label(row_labels[i]) : std::to_string(i);
    };
    double label_width = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        label_width = std::max(label_width, text_width(row_label(i)));
    }
    const double left = 45 + label_width, top = 50, bottom = kHeight - 60, right = kWidth - 120;
    const std::size_t n_rows = rows.size();

    Canvas c;
    c.labels(title, xlabel, ylabel, left, right, top, bottom);
    if (n_rows == 0 || cols == 0) {
        c.text((left + right) / 2, (top + bottom) / 2, "no data",
               "font-size=\"16\" fill=\"#888\" text-anchor=\"middle\"");
        return c.finish();
    }
    const bool has_values = v_min <= v_max;
    const auto norm = [&](double v) { return v_max > v_min ? (v - v_min) / (v_max - v_min) : 0.5; };
    const double cw = (right - left) / static_cast<double>(cols);
    const double ch = (bottom - top) / static_cast<double>(n_rows);
    const bool tooltips = n_rows * cols <= 20000;  // keeps large maps to a sane file size

    c.raw("<g shape-rendering=\"crispEdges\">\n");
    for (std::size_t r = 0; r < n_rows; ++r) {
        for (std::size_t col = 0; col < cols; ++col) {
            const bool present     = col < rows[r].size() && std::isfinite(rows[r][col]);
            const std::string fill = present ? scale_color(norm(rows[r][col])) : "#dddddd";
            c.raw(
                fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" "
                            "fill=\"{}\"",
                            left + static_cast<double>(col) * cw, top + static_cast<double>(r) * ch,
                            cw, ch, fill));
            if (tooltips) {
                const std::string value = present ? fmt::format("{:g}", rows[r][col]) : "none";
                c.raw(fmt::format("><title>{}, {}: {}</title></rect>\n", escape_xml(row_label(r)),
                                  col, value));
            } else {
                c.raw("/>\n");
            }
        }
    }
    c.raw("</g>\n");
    c.raw(fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
        "stroke=\"#333\"/>\n",
        left, top, right - left, bottom - top));

    // At most ~25 row labels and ~20 column labels, evenly thinned.
    const std::size_t row_every = (n_rows + 24) / 25, col_every = (cols + 19) / 20;
    for (std::size_t r = 0; r < n_rows; r += row_every) {
        c.text(left - 6, top + (static_cast<double>(r) + 0.5) * ch + 4, row_label(r),
               "font-size=\"11\" text-anchor=\"end\"");
    }
    for (std::size_t col = 0; col < cols; col += col_every) {
        c.text(left + (static_cast<double>(col) + 0.5) * cw, bottom + 16, std::to_string(col),
               "font-size=\"11\" text-anchor=\"middle\"");
    }

    // Colour bar: low values at the bottom.
    const double bx = right + 20, bw = 18;
    std::string stops;
    for (std::size_t i = 0; i < kScale.size(); ++i) {
        const double t = static_cast<double>(i) / static_cast<double>(kScale.size() - 1);
        stops += fmt::format("<stop offset=\"{:.3f}\" stop-color=\"{}\"/>", t, scale_color(t));
    }
    c.raw(
        fmt::format("<defs><linearGradient id=\"bgl-scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">{}"
                    "</linearGradient></defs>\n"
                    "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                    "fill=\"url(#bgl-scale)\" "
                    "stroke=\"#333\"/>\n",
                    stops, bx, top, bw, bottom - top));
    const auto bar_tick = [&](double y, const std::string& label) {
        c.line(bx + bw, y, bx + bw + 4, y, "#333");
        c.text(bx + bw + 7, y + 4, label, "font-size=\"11\"");
    };
    if (has_values && v_max > v_min) {
        const Ticks vt = nice_ticks(v_min, v_max, 5);
        for (double v : vt.values) {
            if (v < v_min - 1e-9 * vt.step || v > v_max + 1e-9 * vt.step) continue;
            bar_tick(bottom - norm(v) * (bottom - top), format_tick(v, vt.step));
        }
    } else if (has_values) {
        bar_tick((top + bottom) / 2, fmt::format("{:g}", v_min));
    }
    const double vy = (top + bottom) / 2, vx = kWidth - 12;
    c.text(vx, vy, value_label,
           fmt::format(
               "font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 {:.1f} {:.1f})\"",
               vx, vy));
    return c.finish();
}

}  // namespace bagualu::report
