// Shim of glog's glog/logging.h (TENT logs through glog; the adapter does
// too): LOG(severity) and VLOG(n) as streams. A LOG line goes to stderr
// and is kept, so that a test can check what the adapter logged
// (orbite_tent_shim::logged()); VLOG lines are dropped.
#ifndef ORBITE_TENT_SHIM_GLOG_LOGGING_H
#define ORBITE_TENT_SHIM_GLOG_LOGGING_H

#include <ios>
#include <sstream>
#include <string>
#include <vector>

namespace orbite_tent_shim {

/// Every LOG line of this process so far, "SEVERITY text".
std::vector<std::string> logged();
void log_line(const char* severity, const std::string& text);

class Line {
   public:
    explicit Line(const char* severity) : severity_(severity) {}
    ~Line() { log_line(severity_, out_.str()); }
    Line(const Line&) = delete;
    Line& operator=(const Line&) = delete;
    template <typename T>
    Line& operator<<(const T& v) {
        out_ << v;
        return *this;
    }
    Line& operator<<(std::ios_base& (*manip)(std::ios_base&)) {
        out_ << manip;
        return *this;
    }

   private:
    const char* severity_;
    std::ostringstream out_;
};

struct Dropped {
    template <typename T>
    Dropped& operator<<(const T&) {
        return *this;
    }
    Dropped& operator<<(std::ios_base& (*)(std::ios_base&)) { return *this; }
};

}  // namespace orbite_tent_shim

#define LOG(severity) ::orbite_tent_shim::Line(#severity)
#define VLOG(level) ::orbite_tent_shim::Dropped()

#endif
