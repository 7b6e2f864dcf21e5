// Status and Result: what a caller sees of an error, including value() taken from one.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "hmc/status.h"

using hmc::ErrorCode;
using hmc::Result;
using hmc::Status;

TEST_CASE("a Result holds a value or says why not", "[status]") {
  Result<int> good(7);
  REQUIRE(good.ok());
  CHECK(good.value() == 7);
  CHECK(good.status().ok());
  Result<std::string> bad(Status(ErrorCode::kUnavailable, "no CUDA driver"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == ErrorCode::kUnavailable);
  CHECK(bad.status().to_string() == "unavailable: no CUDA driver");
}

// value() of a failed Result is a programming error; the caller must learn which error it
// held (std::get's "wrong index for variant" said nothing). In a child, which must abort.
TEST_CASE("value() of a failed Result names the error and aborts", "[status]") {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    alarm(20);  // never outlives the test
    dup2(pipe_fds[1], STDERR_FILENO);
    signal(SIGABRT, SIG_DFL);  // Catch's handler would report the abort and exit instead
    const Result<int> bad(Status(ErrorCode::kPeerLost, "rank 1 closed the connection"));
    const int v = bad.value();  // must not return
    _exit(v == 0 ? 3 : 4);
  }
  close(pipe_fds[1]);
  std::string said;
  char buf[256];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof(buf))) > 0;) said.append(buf, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT));
  CHECK(said.find("hmc: Result::value() called on an error: peer lost: rank 1 closed the connection") != std::string::npos);
}
