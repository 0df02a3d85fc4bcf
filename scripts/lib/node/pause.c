/* The real node's pause image (scripts/k8s-node.sh): sleeps until SIGTERM or SIGINT, as Kubernetes' pause. */
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
  signal(SIGTERM, done);
  signal(SIGINT, done);
  for (;;) pause();
}
