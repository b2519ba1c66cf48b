#include "runtime/observability/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <sstream>

#include "common/utf8.h"

namespace cxxlaunch::runtime {
namespace {

constexpr size_t kMaxPlotted = 2000;
// Up to this many values each get a marker: a series of a few points (an evaluation before and
// after training) is then read as points, not as a line that claims values in between.
constexpr size_t kMarkedPoints = 50;

std::string utcTime(double seconds) {
  const auto t = static_cast<time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds));
  char text[32];
  std::snprintf(text, sizeof(text), "%lldh %02lldm %02llds", s / 3600, s / 60 % 60, s % 60);
  return text;
}

// At most kMaxPlotted points: in each stretch the first point and the one farthest from it.
std::vector<std::pair<int64_t, double>> thinned(const std::vector<std::pair<int64_t, double>>& in) {
  if (in.size() <= kMaxPlotted) return in;
  const size_t stretch = (in.size() + kMaxPlotted / 2 - 1) / (kMaxPlotted / 2);
  std::vector<std::pair<int64_t, double>> out;
  for (size_t begin = 0; begin < in.size(); begin += stretch) {
    const size_t end = std::min(in.size(), begin + stretch);
    size_t extreme = begin;
    for (size_t i = begin; i < end; ++i) {
      if (std::fabs(in[i].second - in[begin].second) >
          std::fabs(in[extreme].second - in[begin].second)) {
        extreme = i;
      }
    }
    out.push_back(in[begin]);
    if (extreme != begin) out.push_back(in[extreme]);
  }
  if (out.back() != in.back()) out.push_back(in.back());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// An axis label that fits the plot's margin: "23.34k", "1.2M", "0.00075".
std::string label(double value) {
  char text[32];
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e4 && magnitude < 1e6) {
    std::snprintf(text, sizeof(text), "%.4gk", value / 1e3);
  } else if (magnitude >= 1e6 && magnitude < 1e9) {
    std::snprintf(text, sizeof(text), "%.4gM", value / 1e6);
  } else {
    std::snprintf(text, sizeof(text), "%.4g", value);
  }
  return text;
}

// A value of the scalars' table: six significant digits (the tracker files hold them all).
std::string shown(double value) {
  if (!std::isfinite(value)) return formatNumber(value);
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

}  // namespace

std::string htmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  // The page is UTF-8: bytes that are not (a path, a name) are shown as \xHH, not as U+FFFD.
  for (const char c : backslashReplaceInvalidUtf8(text)) {
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
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svgPlot(const ReportSeries& series, int width, int height) {
  const double left = 64, right = 16, top = 12, bottom = 34;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const auto points = thinned(series.points);
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min;
  double y_min = x_min, y_max = -x_min;
  for (const auto& [step, value] : points) {
    x_min = std::min(x_min, static_cast<double>(step));
    x_max = std::max(x_max, static_cast<double>(step));
    if (!std::isfinite(value)) continue;
    y_min = std::min(y_min, value);
    y_max = std::max(y_max, value);
  }
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\" role=\"img\" aria-label=\""
      << htmlEscape(series.name) << " against step\">\n";
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\""
      << plot_h << "\" fill=\"#fff\" stroke=\"#999\"/>\n";
  if (!std::isfinite(y_min)) {
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << top + plot_h / 2
        << "\" text-anchor=\"middle\" fill=\"#666\">no finite values yet</text>\n</svg>";
    return svg.str();
  }
  if (y_max == y_min) {  // a flat line in the middle
    const double pad = y_min == 0 ? 1 : std::fabs(y_min) * 0.05;
    y_min -= pad;
    y_max += pad;
  }
  if (x_max == x_min) x_max = x_min + 1;
  const auto x_of = [&](double step) { return left + (step - x_min) / (x_max - x_min) * plot_w; };
  const auto y_of = [&](double v) { return top + (y_max - v) / (y_max - y_min) * plot_h; };
  // Grid and labels: five ticks on each axis. Steps are whole numbers: each step label stands at
  // its own step (a few steps get fewer ticks), never at a fraction it was rounded from.
  double last_step = -std::numeric_limits<double>::infinity();
  for (int i = 0; i <= 4; ++i) {
    const double v = y_min + (y_max - y_min) * i / 4, y = y_of(v);
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + plot_w << "\" y2=\""
        << y << "\" stroke=\"#e4e4e4\"/><text x=\"" << left - 6 << "\" y=\"" << y + 4
        << "\" text-anchor=\"end\" font-size=\"11\" fill=\"#444\">" << label(v) << "</text>\n";
    const double s = std::round(x_min + (x_max - x_min) * i / 4);
    if (s == last_step || s > x_max) continue;
    last_step = s;
    svg << "<text class=\"step\" x=\"" << x_of(s) << "\" y=\"" << height - 18
        << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"#444\">" << label(s) << "</text>\n";
  }
  // The line, broken at values that are not finite.
  std::ostringstream path;
  bool pen_down = false;
  size_t drawn = 0;
  for (const auto& [step, value] : points) {
    if (!std::isfinite(value)) {
      pen_down = false;
      continue;
    }
    path << (pen_down ? " L" : " M") << x_of(static_cast<double>(step)) << " " << y_of(value);
    pen_down = true;
    ++drawn;
  }
  svg << "<path class=\"series\" d=\"" << path.str()
      << "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  // A marker on every value of a short series (a single value would otherwise draw nothing).
  if (drawn <= kMarkedPoints) {
    for (const auto& [step, value] : points) {
      if (!std::isfinite(value)) continue;
      svg << "<circle class=\"point\" cx=\"" << x_of(static_cast<double>(step)) << "\" cy=\""
          << y_of(value) << "\" r=\"" << (drawn == 1 ? 4 : 3) << "\" fill=\"#1f77b4\"/>\n";
    }
  }
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 3
      << "\" text-anchor=\"middle\" font-size=\"10\" fill=\"#666\">step</text>\n</svg>";
  return svg.str();
}

std::string renderReport(const ReportContent& c) {
  std::ostringstream html;
  const std::string name = htmlEscape(c.run_name);
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       << "<title>" << name << " — cxxlaunch report</title>\n"
       << "<style>body{font-family:sans-serif;margin:24px;color:#222;background:#fafafa}"
          "h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
          "table{border-collapse:collapse;font-size:13px}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
          "th{background:#eee}.plots{display:flex;flex-wrap:wrap;gap:16px}"
          ".plot{background:#fff;border:1px solid #ddd;padding:8px}"
          ".plot h3{font-size:14px;margin:0 0 4px 0;font-family:monospace}"
          ".finished{color:#2a7d2a}.running{color:#b36b00}</style>\n</head><body>\n";
  html << "<h1>Run " << name << "</h1>\n<h2>Summary</h2>\n<table class=\"summary\">\n";
  const auto row = [&html](const std::string& key, const std::string& value) {
    html << "<tr><th>" << htmlEscape(key) << "</th><td>" << htmlEscape(value) << "</td></tr>\n";
  };
  html << "<tr><th>status</th><td class=\"" << (c.finished ? "finished" : "running") << "\">"
       << (c.finished ? "finished" : "running") << "</td></tr>\n";
  row("started", utcTime(c.started));
  row(c.finished ? "ended" : "updated", utcTime(c.updated));
  row("elapsed", duration(c.updated - c.started));
  row("logs", std::to_string(c.logs));
  for (const auto& [key, value] : c.summary) row(key, value.text());
  html << "</table>\n";

  html << "<h2>Scalars</h2>\n";
  if (c.series.empty()) html << "<p>Nothing logged yet.</p>\n";
  if (!c.series.empty()) {
    html << "<table class=\"scalars\"><tr><th>scalar</th><th>last step</th><th>last</th>"
            "<th>min</th><th>max</th></tr>\n";
    for (const auto& s : c.series) {
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (const auto& p : s.points) {
        if (!std::isfinite(p.second)) continue;
        lo = std::min(lo, p.second);
        hi = std::max(hi, p.second);
      }
      html << "<tr><td>" << htmlEscape(s.name) << "</td><td>" << s.points.back().first
           << "</td><td>" << shown(s.points.back().second) << "</td><td>"
           << (std::isfinite(lo) ? shown(lo) : "-") << "</td><td>"
           << (std::isfinite(hi) ? shown(hi) : "-") << "</td></tr>\n";
    }
    html << "</table>\n<div class=\"plots\">\n";
    for (const auto& s : c.series) {
      html << "<div class=\"plot\"><h3>" << htmlEscape(s.name) << "</h3>\n"
           << svgPlot(s, 480, 220) << "\n</div>\n";
    }
    html << "</div>\n";
  }

  html << "<h2>Config</h2>\n";
  if (c.config.empty()) html << "<p>No config given to initTrackers.</p>\n";
  if (!c.config.empty()) {
    html << "<table class=\"config\">\n";
    for (const auto& [key, value] : c.config) row(key, value.text());
    html << "</table>\n";
  }
  html << "<p style=\"color:#888;font-size:12px\">Written by cxxlaunch; rewritten as the run "
          "logs.</p>\n</body></html>\n";
  return html.str();
}

}  // namespace cxxlaunch::runtime
