// exec_floor: the same process listings as benchmarks/bench_exec_budget.py, from a compiled client.
//
// It answers one question: how much of the CPU an exec costs the controller is Python's, and how
// much any client of the apiserver's pods/exec pays on this machine. Each exec is what the
// controller's own transport does (ghostgpu/signals/podexec.py): a new TCP + TLS connection that
// resumes one kept TLS 1.3 session, a websocket upgrade (v4.channel.k8s.io), messages read until
// the exit status. The key exchange is X25519 only, the one OpenSSL 3.0 offers the controller (Go's
// default adds a post-quantum hybrid that costs more). Pods (namespace/name) come on stdin; one
// JSON line of results goes to stdout. Run through bench_exec_budget.py --compiled, which passes the
// query the controller builds for its process listing (podexec._exec_query of PS_ARGV).
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

type result struct {
	Execs        int     `json:"execs"`
	Failed       int64   `json:"failed"`
	Resumed      int64   `json:"resumed"`
	CPUMsPerExec float64 `json:"cpu_ms_per_exec"`
	UserMs       float64 `json:"user_ms_per_exec"`
	SysMs        float64 `json:"sys_ms_per_exec"`
	WallS        float64 `json:"wall_s"`
}

func rusage() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

type client struct {
	host    string
	query   string // the exec's query string, as the controller builds it
	tls     *tls.Config
	resumed atomic.Int64
}

func (c *client) exec(pod string) error {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok {
		return fmt.Errorf("pod %q is not namespace/name", pod)
	}
	raw, err := net.Dial("tcp", c.host)
	if err != nil {
		return err
	}
	conn := tls.Client(raw, c.tls)
	defer conn.Close()
	if err := conn.Handshake(); err != nil {
		return err
	}
	if conn.ConnectionState().DidResume {
		c.resumed.Add(1)
	}
	// ws://: the connection is already TLS; the dialer only writes the upgrade over it.
	target, err := url.Parse(fmt.Sprintf("ws://%s/api/v1/namespaces/%s/pods/%s/exec?%s", c.host, ns, name, c.query))
	if err != nil {
		return err
	}
	header := http.Header{"Sec-WebSocket-Protocol": {"v4.channel.k8s.io"}}
	ws, resp, err := websocket.NewClient(conn, target, header, 4096, 4096)
	if err != nil {
		if resp != nil {
			return fmt.Errorf("upgrade: %s", resp.Status)
		}
		return err
	}
	for {
		_, msg, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		if len(msg) > 0 && msg[0] == 3 { // the error channel carries the exit status, last
			return nil
		}
	}
}

func main() {
	server := flag.String("server", "", "apiserver URL (https://host:port)")
	caFile := flag.String("ca", "", "CA certificate file")
	certFile := flag.String("cert", "", "client certificate file")
	keyFile := flag.String("key", "", "client key file")
	query := flag.String("query", "", "the exec's query string (command=..., container=..., streams)")
	concurrency := flag.Int("concurrency", 8, "execs in flight")
	qps := flag.Float64("qps", 0, "execs per second, released in batches (0: back to back)")
	batch := flag.Int("batch", 8, "execs released at once when paced")
	flag.Parse()

	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		panic("no certificate in " + *caFile)
	}
	pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		panic(err)
	}
	u, err := url.Parse(*server)
	if err != nil {
		panic(err)
	}
	if *query == "" {
		panic("no -query")
	}
	c := &client{host: u.Host, query: *query, tls: &tls.Config{
		RootCAs:            roots,
		Certificates:       []tls.Certificate{pair},
		ServerName:         u.Hostname(),
		ClientSessionCache: tls.NewLRUClientSessionCache(1),
		CurvePreferences:   []tls.CurveID{tls.X25519},
	}}
	var pods []string
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		if p := strings.TrimSpace(lines.Text()); p != "" {
			pods = append(pods, p)
		}
	}
	if len(pods) == 0 {
		panic("no pods on stdin")
	}
	if err := c.exec(pods[0]); err != nil { // warm: the first full handshake keeps the session
		panic(err)
	}
	c.resumed.Store(0)

	var failed atomic.Int64
	slots := make(chan struct{}, *concurrency)
	var wg sync.WaitGroup
	u0, s0 := rusage()
	start := time.Now()
	for i, pod := range pods {
		if *qps > 0 && i > 0 && i%*batch == 0 {
			time.Sleep(time.Duration(float64(*batch) / *qps * float64(time.Second)))
		}
		slots <- struct{}{}
		wg.Add(1)
		go func(pod string) {
			defer wg.Done()
			defer func() { <-slots }()
			if err := c.exec(pod); err != nil {
				if failed.Add(1) <= 3 {
					fmt.Fprintln(os.Stderr, pod, err)
				}
			}
		}(pod)
	}
	wg.Wait()
	wall := time.Since(start)
	u1, s1 := rusage()
	n := float64(len(pods))
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
	out := result{
		Execs: len(pods), Failed: failed.Load(), Resumed: c.resumed.Load(),
		CPUMsPerExec: ms(u1 - u0 + s1 - s0), UserMs: ms(u1 - u0), SysMs: ms(s1 - s0), WallS: wall.Seconds(),
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
}
