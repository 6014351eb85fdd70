// Tests for the SVG charts: tick placement and labels, escaping, and that every chart (normal,
// empty, single point, NaN-ridden, log scale, heatmap) is well-formed XML with sane coordinates.
// A small XML checker below stands in for a real parser.
#include "report/svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>

#include "core/error.h"

namespace bagualu::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- a minimal XML well-formedness check ----

struct XmlSummary {
    std::string error;                    // empty when well-formed
    std::map<std::string, int> elements;  // element name -> count
    std::vector<std::string> texts;       // character data, entities left as written
};

bool valid_entities(const std::string& s) {
    static const std::regex entity("&(amp|lt|gt|quot|apos|#[0-9]+);");
    for (std::size_t i = s.find('&'); i != std::string::npos; i = s.find('&', i + 1)) {
        std::smatch m;
        const std::string rest = s.substr(i);
        if (!std::regex_search(rest, m, entity, std::regex_constants::match_continuous)) {
            return false;
        }
    }
    return true;
}

XmlSummary check_xml(const std::string& doc) {
    XmlSummary out;
    std::vector<std::string> open;
    int roots     = 0;
    std::size_t i = 0;
    static const std::regex attr_re(R"(\s+([A-Za-z_:][-A-Za-z0-9_:.]*)="([^"<]*)\")");
    while (i < doc.size()) {
        if (doc[i] != '<') {
            const std::size_t next = std::min(doc.find('<', i), doc.size());
            const std::string text = doc.substr(i, next - i);
            if (text.find('>') != std::string::npos || !valid_entities(text)) {
                return {"bad character data: " + text, {}, {}};
            }
            if (text.find_first_not_of(" \n") != std::string::npos) {
                if (open.empty()) return {"text outside the root", {}, {}};
                out.texts.push_back(text);
            }
            i = next;
            continue;
        }
        const std::size_t close = doc.find('>', i);
        if (close == std::string::npos) return {"unterminated tag", {}, {}};
        std::string tag = doc.substr(i + 1, close - i - 1);
        i               = close + 1;
        if (tag.starts_with('/')) {
            if (open.empty() || open.back() != tag.substr(1))
                return {"mismatched </" + tag, {}, {}};
            open.pop_back();
            continue;
        }
        const bool self_closing = tag.ends_with('/');
        if (self_closing) tag.pop_back();
        const std::size_t name_end = std::min(tag.find_first_of(" \n"), tag.size());
        const std::string name     = tag.substr(0, name_end);
        if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) {
            return {"bad tag name in <" + tag, {}, {}};
        }
        // Attributes must be name="value" pairs, nothing else.
        std::string rest = tag.substr(name_end);
        while (!rest.empty() && rest.back() == ' ') rest.pop_back();
        std::smatch m;
        while (std::regex_search(rest, m, attr_re, std::regex_constants::match_continuous)) {
            if (!valid_entities(m[2].str())) return {"bad attribute value in <" + tag, {}, {}};
            rest = m.suffix();
        }
        if (!rest.empty()) return {"bad attributes in <" + tag + ">: " + rest, {}, {}};
        if (open.empty() && ++roots > 1) return {"more than one root", {}, {}};
        ++out.elements[name];
        if (!self_closing) open.push_back(name);
    }
    if (!open.empty()) return {"unclosed <" + open.back() + ">", {}, {}};
    if (roots != 1) return {"no root element", {}, {}};
    return out;
}

// Every coordinate attribute is a finite number on the 800x500 canvas.
void expect_coordinates_on_canvas(const std::string& svg) {
    static const std::regex coord(R"#(\s(x|y|x1|x2|y1|y2|cx|cy)="([^"]*)")#");
    int count = 0;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), coord);
         it != std::sregex_iterator(); ++it) {
        const std::string attr = (*it)[1].str(), value = (*it)[2].str();
        const double v     = std::stod(value);
        const double limit = attr.find('x') != std::string::npos ? 800 : 500;
        EXPECT_TRUE(std::isfinite(v) && v >= 0 && v <= limit) << attr << "=" << value;
        ++count;
    }
    EXPECT_GT(count, 0);
    for (const char* bad : {"nan", "inf"}) EXPECT_EQ(svg.find(bad), std::string::npos) << bad;
}

XmlSummary expect_well_formed(const std::string& svg) {
    XmlSummary s = check_xml(svg);
    EXPECT_EQ(s.error, "") << svg.substr(0, 2000);
    EXPECT_EQ(s.elements["svg"], 1);
    EXPECT_NE(svg.find("width=\"800\" height=\"500\""), std::string::npos);
    expect_coordinates_on_canvas(svg);
    return s;
}

bool has_text(const XmlSummary& s, const std::string& t) {
    return std::find(s.texts.begin(), s.texts.end(), t) != s.texts.end();
}

// ---- ticks ----

TEST(SvgTicks, LinearTicksAreNiceAndCoverTheData) {
    const std::vector<std::pair<double, double>> ranges = {
        {0, 1000}, {0.13, 0.87}, {-3.7, 12.2}, {1e-9, 3e-9}, {5, 5},           {0, 0},
        {-2, -2},  {2.5, 2.51},  {1e6, 5e7},   {-1e-3, 0},   {10.0, 10.000001}};
    for (const auto& [lo, hi] : ranges) {
        SCOPED_TRACE(fmt::format("[{}, {}]", lo, hi));
        const Ticks t = nice_ticks(lo, hi, 6);
        ASSERT_GE(t.values.size(), 2u);
        EXPECT_LE(t.values.size(), 13u);
        EXPECT_LE(t.lo, lo);
        EXPECT_GE(t.hi, hi);
        EXPECT_LT(t.lo, t.hi);
        EXPECT_DOUBLE_EQ(t.values.front(), t.lo);
        EXPECT_NEAR(t.values.back(), t.hi, 1e-9 * t.step);
        const double mantissa = t.step / std::pow(10.0, std::floor(std::log10(t.step)));
        EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 ||
                    std::abs(mantissa - 5) < 1e-9)
            << t.step;
        for (std::size_t i = 1; i < t.values.size(); ++i) {
            EXPECT_NEAR(t.values[i] - t.values[i - 1], t.step, 1e-6 * t.step);
        }
    }
    EXPECT_EQ(nice_ticks(0, 1000).values, (std::vector<double>{0, 200, 400, 600, 800, 1000}));
    EXPECT_EQ(nice_ticks(0.13, 0.87).step, 0.2);
}

TEST(SvgTicks, LabelsHaveJustTheDigitsTheStepNeeds) {
    EXPECT_EQ(format_tick(0.2, 0.2), "0.2");
    EXPECT_EQ(format_tick(0.1 + 0.2, 0.1), "0.3");
    EXPECT_EQ(format_tick(1000, 200), "1000");
    EXPECT_EQ(format_tick(-0.0, 0.5), "0");
    EXPECT_EQ(format_tick(1e-17, 0.1), "0");
    EXPECT_EQ(format_tick(2.5e-3, 5e-4), "0.0025");
    EXPECT_EQ(format_tick(3e7, 1e7), "3e+07");
    EXPECT_EQ(format_tick(1.5e-6, 5e-7), "1.5e-06");
    EXPECT_EQ(format_tick(0.001, 0), "0.001");
}

TEST(SvgTicks, LogTicksSnapToPowersAndMantissas) {
    const Ticks wide = log_ticks(0.013, 87);
    EXPECT_DOUBLE_EQ(wide.lo, 0.01);
    EXPECT_DOUBLE_EQ(wide.hi, 100);
    EXPECT_EQ(wide.values.size(), 13u);  // 1, 2, 5 per decade over four decades, plus 100
    const Ticks narrow = log_ticks(2.3, 4.5);
    EXPECT_EQ(narrow.values, (std::vector<double>{2, 3, 4, 5}));
    const Ticks huge = log_ticks(1e-8, 1e4);
    EXPECT_LE(huge.values.size(), 9u);
    EXPECT_DOUBLE_EQ(huge.lo, 1e-8);
    EXPECT_DOUBLE_EQ(huge.hi, 1e4);
    const Ticks one = log_ticks(7, 7);
    EXPECT_LT(one.lo, 7);
    EXPECT_GT(one.hi, 7);
}

TEST(SvgText, EscapesMarkupAndDropsControlCharacters) {
    EXPECT_EQ(escape_xml("a<b>&\"c'\x01"), "a&lt;b&gt;&amp;&quot;c&apos;");
    EXPECT_EQ(escape_xml("loss \xce\xbb"), "loss \xce\xbb");
}

// ---- line charts ----

TEST(LineChart, DrawsTwoSeriesWithLegendTicksAndEscapedText) {
    Series train{"train <loss>", "", {}, {}}, val{"val & loss", "#d62728", {}, {}};
    for (int s = 0; s <= 1000; s += 10) {
        train.x.push_back(s);
        train.y.push_back(4.0 * std::exp(-s / 300.0) + 1.0);
    }
    for (int s = 0; s <= 1000; s += 250) {
        val.x.push_back(s);
        val.y.push_back(4.2 * std::exp(-s / 300.0) + 1.1);
    }
    const std::vector<Series> series = {train, val};
    const std::string svg            = line_chart_svg("Loss \"run\"", "step", "loss", series);
    const XmlSummary s               = expect_well_formed(svg);
    EXPECT_TRUE(has_text(s, "train &lt;loss&gt;"));
    EXPECT_TRUE(has_text(s, "val &amp; loss"));
    EXPECT_TRUE(has_text(s, "Loss &quot;run&quot;"));
    EXPECT_TRUE(has_text(s, "step"));
    EXPECT_TRUE(has_text(s, "loss"));
    for (const char* tick : {"0", "200", "400", "600", "800", "1000", "1", "2", "3", "4", "5"}) {
        EXPECT_TRUE(has_text(s, tick)) << tick;
    }
    EXPECT_EQ(s.elements.at("path"), 2);
    EXPECT_EQ(s.elements.at("circle"), 5);  // only the sparse validation series gets markers
    EXPECT_NE(svg.find("stroke=\"#d62728\""), std::string::npos);
}

TEST(LineChart, SkipsNonFiniteAndBreaksTheLine) {
    const Series s{"s", "", {0, 1, 2, 3, 4, kNaN, 6}, {1, 2, kNaN, 4, kInf, 5, 6}};
    const std::string svg = line_chart_svg("t", "x", "y", std::span(&s, 1));
    expect_well_formed(svg);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(svg, m, std::regex("<path d=\"([^\"]*)\"")));
    const std::string d = m[1];
    EXPECT_EQ(std::count(d.begin(), d.end(), 'M'), 1);  // 0-1; 3 and 6 stand alone as dots
    EXPECT_EQ(std::count(d.begin(), d.end(), 'L'), 1);
}

TEST(LineChart, HandlesEmptyInputAndSinglePoints) {
    const XmlSummary none = expect_well_formed(line_chart_svg("t", "x", "y", {}));
    EXPECT_TRUE(has_text(none, "no data"));

    const Series empty{"empty", "", {}, {}};
    const XmlSummary e = expect_well_formed(line_chart_svg("t", "x", "y", std::span(&empty, 1)));
    EXPECT_TRUE(has_text(e, "no data"));
    EXPECT_TRUE(has_text(e, "empty (no data)"));

    const Series one{"one", "", {5}, {2.5}};
    const std::string svg = line_chart_svg("t", "x", "y", std::span(&one, 1));
    const XmlSummary s    = expect_well_formed(svg);
    EXPECT_EQ(s.elements.at("circle"), 1);
    EXPECT_EQ(s.elements.count("path"), 0u);
    EXPECT_FALSE(has_text(s, "no data"));
}

TEST(LineChart, LogScaleSkipsNonPositiveValues) {
    const Series s{"s", "", {0, 1, 2, 3}, {0, 0.01, 1, 100}};
    const XmlSummary x = expect_well_formed(line_chart_svg("t", "x", "y", std::span(&s, 1), true));
    for (const char* tick : {"0.01", "0.1", "1", "10", "100"})
        EXPECT_TRUE(has_text(x, tick)) << tick;
    const Series negative{"n", "", {0, 1}, {-1, 0}};
    const XmlSummary n =
        expect_well_formed(line_chart_svg("t", "x", "y", std::span(&negative, 1), true));
    EXPECT_TRUE(has_text(n, "no data"));
}

TEST(LineChart, ManySeriesGetDistinctStrokesAndOneLegendEntryEach) {
    // 12 runs: more than the 10 palette colours, so the last two must differ by dash pattern.
    std::vector<Series> series;
    for (int k = 0; k < 12; ++k) {
        Series s{fmt::format("run {}", k), "", {}, {}};
        for (int step = 0; step <= 100; step += 20) {
            s.x.push_back(step);
            s.y.push_back(k == 3 && step == 40 ? kNaN : 5.0 - 0.01 * step + 0.1 * k);
        }
        series.push_back(s);
    }
    const std::string svg = line_chart_svg("Val loss", "step", "val loss", series);
    const XmlSummary x    = expect_well_formed(svg);
    for (int k = 0; k < 12; ++k) EXPECT_TRUE(has_text(x, fmt::format("run {}", k))) << k;
    EXPECT_EQ(x.elements.at("path"), 12);
    EXPECT_EQ(x.elements.at("title"), 12);  // one hover group per series
    // 6 points per series, all dotted (sparse), less the NaN of run 3.
    EXPECT_EQ(x.elements.at("circle"), 12 * 6 - 1);

    std::set<std::string> strokes;
    const std::regex path_re(
        "<path d=\"([^\"]*)\" fill=\"none\" stroke=\"([^\"]*)\"[^>]*?"
        "(stroke-dasharray=\"([^\"]*)\")?/>");
    std::vector<std::string> paths;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), path_re);
         it != std::sregex_iterator(); ++it) {
        strokes.insert((*it)[2].str() + "/" + (*it)[4].str());
        paths.push_back((*it)[1]);
    }
    ASSERT_EQ(paths.size(), 12u);
    EXPECT_EQ(strokes.size(), 12u) << "two series share colour and dash pattern";
    // Run 3's NaN at step 40 breaks its line into two pieces; the others are one piece each.
    EXPECT_EQ(std::count(paths[3].begin(), paths[3].end(), 'M'), 2);
    EXPECT_EQ(std::count(paths[2].begin(), paths[2].end(), 'M'), 1);
    // The legend draws a sample line per series, dashed like its series.
    const std::regex legend_re("<line [^>]*stroke-width=\"2.5\"( stroke-dasharray=\"[^\"]*\")?/>");
    EXPECT_EQ(std::distance(std::sregex_iterator(svg.begin(), svg.end(), legend_re),
                            std::sregex_iterator()),
              12);
}

TEST(LineChart, MismatchedSeriesIsAnInternalError) {
    const Series s{"s", "", {0, 1}, {1}};
    EXPECT_THROW(line_chart_svg("t", "x", "y", std::span(&s, 1)), InternalError);
}

// ---- heatmaps ----

TEST(Heatmap, DrawsOneCellPerValueWithLabelsAndScale) {
    const std::vector<std::vector<double>> rows = {{1, 2, 3, 4}, {4, 3, 2, 1}, {0, 0, 8, 0}};
    const std::vector<std::string> labels       = {"step 10", "step 20", "step <30>"};
    const std::string svg = heatmap_svg("expert load", "expert", "step", rows, labels, "tokens");
    const XmlSummary s    = expect_well_formed(svg);
    EXPECT_EQ(s.elements.at("title"), 12);
    EXPECT_TRUE(has_text(s, "step &lt;30&gt;"));
    EXPECT_TRUE(has_text(s, "tokens"));
    EXPECT_TRUE(has_text(s, "3"));  // a column index
    EXPECT_TRUE(has_text(s, "8"));  // the top of the colour scale
    EXPECT_EQ(s.elements.at("linearGradient"), 1);
    EXPECT_NE(svg.find("#440154"), std::string::npos);  // the lowest value gets the low end
    EXPECT_NE(svg.find("#fde725"), std::string::npos);  // and the highest the high end
}

TEST(Heatmap, HandlesRaggedNanConstantAndEmptyInput) {
    const std::string ragged = heatmap_svg("t", "x", "y", {{1, kNaN}, {2}}, {}, "");
    expect_well_formed(ragged);
    EXPECT_NE(ragged.find("#dddddd"), std::string::npos);

    const XmlSummary flat = expect_well_formed(heatmap_svg("t", "x", "y", {{3, 3}, {3, 3}}));
    EXPECT_TRUE(has_text(flat, "3"));

    const XmlSummary empty = expect_well_formed(heatmap_svg("t", "x", "y", {}));
    EXPECT_TRUE(has_text(empty, "no data"));

    std::vector<std::vector<double>> big(300, std::vector<double>(100, 1.0));
    big[5][7]               = 2;
    const std::string large = heatmap_svg("t", "x", "y", big);
    const XmlSummary l      = expect_well_formed(large);
    EXPECT_LE(l.elements.at("text"), 25 + 20 + 10);  // labels thinned out
}

}  // namespace
}  // namespace bagualu::report
