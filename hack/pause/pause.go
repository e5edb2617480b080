// pause: the real node's pod sandbox process. It holds the pod's namespaces open, reaps the
// orphans a shared pid namespace hands it, and exits on SIGINT/SIGTERM — what the upstream pause
// container does, built here because no image can be pulled. Its name matters: the controller's
// process classifier knows a pid 1 called `pause` as the holder of a shared pid namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
