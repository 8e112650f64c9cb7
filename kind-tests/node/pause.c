/* The pod sandbox's process for kind-tests/node.sh (no registry here, so no
 * registry.k8s.io/pause): sleeps until SIGINT/SIGTERM, reaps orphans (it is
 * PID 1 of a pod sharing its PID namespace). Built static with cc. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction s = {0};
  s.sa_handler = stop;
  sigaction(SIGINT, &s, NULL);
  sigaction(SIGTERM, &s, NULL);
  s.sa_handler = reap;
  s.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &s, NULL);
  for (;;) pause();
}
