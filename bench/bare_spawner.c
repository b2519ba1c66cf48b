/* The floor of bench/launcher_startup.py: starts N copies of a program with posix_spawn and
 * waits for them, nothing else (no flags, no environment, no folders, no watchdog). Whatever a
 * launcher does beyond this is its own cost; what this takes, on the machine measured, no
 * launcher that execs its workers can go below.
 *
 * usage: bare_spawner N PROGRAM [ARGS...] */
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const int n = atoi(argv[1]);
  pid_t pids[64];
  if (n < 1 || n > 64) return 2;
  for (int i = 0; i < n; ++i) {
    if (posix_spawn(&pids[i], argv[2], NULL, NULL, argv + 2, environ) != 0) return 1;
  }
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    int status = 0;
    if (waitpid(pids[i], &status, 0) == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed = 1;
  }
  return failed;
}
