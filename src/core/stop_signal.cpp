#include "core/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include "core/log.h"

namespace bagualu {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1};

// Written by the handler on whichever thread the signal lands (the helper and loader threads
// included), read by the step loop: an atomic, lock-free and so async-signal-safe.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<bool> g_installed{false};

// The three signals' default actions back (async-signal-safe: sigaction only).
void set_default_actions() {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : kSignals) ::sigaction(s, &dfl, nullptr);
}

// Async-signal-safe only: an atomic exchange, sigaction, signal_name (string literals) and
// write(2).
void on_stop_signal(int sig) {
    int none = 0;
    g_signal.compare_exchange_strong(none, sig);
    set_default_actions();
    if (log::g_rank <= 0) {  // one line for the job, not one per rank
        const char* name = signal_name(sig);
        const char* rest =
            ": stopping after this step, with a checkpoint (again to stop at once)\n";
        const char* head           = "\nbagualu: ";
        [[maybe_unused]] ssize_t n = ::write(2, head, std::strlen(head));
        n                          = ::write(2, name, std::strlen(name));
        n                          = ::write(2, rest, std::strlen(rest));
    }
}

}  // namespace

void install_stop_handlers(bool usr1_only) {
    if (g_installed.exchange(true)) return;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) sigaddset(&sa.sa_mask, s);
    sa.sa_flags = SA_RESTART;  // reads and writes of other threads carry on
    for (int s : kSignals) {
        if (!usr1_only || s == SIGUSR1) ::sigaction(s, &sa, nullptr);
    }
}

void restore_default_stop_handlers() {
    if (g_installed) set_default_actions();
}

int stop_signal() { return g_signal.load(); }

const char* signal_name(int sig) {
    switch (sig) {
        case SIGINT:
            return "SIGINT";
        case SIGTERM:
            return "SIGTERM";
        case SIGUSR1:
            return "SIGUSR1";
        default:
            return "a signal";
    }
}

}  // namespace bagualu
