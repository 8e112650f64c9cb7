// A stand-in for the CSI project's node-driver-registrar (its registration
// mode), for kind-tests/node.sh: the chart's csi-registrar sidecar runs it in
// place of registry.k8s.io/sig-storage/csi-node-driver-registrar, which is in
// no registry reachable here (node/registrar_image.sh packs it at that
// image's entrypoint path). The chart needs the sidecar because kubelet dials
// a registration socket with the socket's path as the HTTP/2 :authority,
// which a Go gRPC server accepts and kai-csi's h2 (Rust) server refuses with
// PROTOCOL_ERROR (hyperium/h2#487), so kai-csi cannot register itself.
//
// As the real registrar does, it asks the CSI driver on --csi-address for
// its name (Identity GetPluginInfo), serves kubelet's plugin registration
// API (pluginregistration/v1) on <--plugin-registration-path>/<name>-reg.sock,
// answers GetInfo with --kubelet-registration-path as the driver's endpoint,
// serves GET /healthz on --http-endpoint (see health: stricter than the
// real one's) and exits when kubelet refuses the plugin. It takes the flags
// the chart passes and no others.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

var (
	csiAddress = flag.String("csi-address", "/run/csi/socket",
		"the CSI driver's socket, as this container sees it (a path or unix:///path)")
	kubeletRegistrationPath = flag.String("kubelet-registration-path", "",
		"the CSI driver's socket as kubelet sees it: the endpoint told to kubelet (required)")
	pluginRegistrationPath = flag.String("plugin-registration-path", "/registration",
		"kubelet's plugins_registry directory, as mounted here: <driver>-reg.sock is created in it")
	httpEndpoint = flag.String("http-endpoint", "",
		"address for GET /healthz (e.g. :9810); empty: no HTTP server")
	verbosity = flag.Int("v", 0, "log verbosity: 2 and up logs each registration call")
)

const (
	// Each GetPluginInfo try, and the bounds of the wait between tries.
	callTimeout = time.Second
	minBackoff  = 100 * time.Millisecond
	maxBackoff  = 5 * time.Second
)

// registrar answers kubelet's plugin watcher and keeps what kubelet last said.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string

	mu         sync.Mutex
	registered bool // kubelet said it registered the plugin (a refusal exits)
}

func (r *registrar) GetInfo(_ context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	if *verbosity >= 2 {
		log.Printf("GetInfo: %s at %s", r.driver, r.endpoint)
	}
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: r.driver, Endpoint: r.endpoint,
		SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		// As node-driver-registrar does: exit, so that the container
		// restarts and registers again (and the refusal shows as restarts).
		log.Printf("kubelet refused %s: %s", r.driver, s.Error)
		os.Exit(1)
	}
	r.mu.Lock()
	r.registered = true
	r.mu.Unlock()
	log.Printf("kubelet registered %s at %s", r.driver, r.endpoint)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// health is nil when the registration socket exists and kubelet has said it
// registered the driver; otherwise why not. Stricter than
// node-driver-registrar's, which checks its socket only: with this one the
// pod's readiness means the kubelet took the driver (node.py still asserts
// CSINode, which holds for the real image too).
func (r *registrar) health(socket string) error {
	st, err := os.Stat(socket)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	if st.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("registration socket %s is not a socket", socket)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.registered {
		return fmt.Errorf("kubelet has not registered %s yet (no NotifyRegistrationStatus)", r.driver)
	}
	return nil
}

// driverName asks the CSI driver for its name, retrying (with a bounded,
// growing wait) until its socket answers or ctx ends.
func driverName(ctx context.Context, address string) (string, error) {
	target := address
	if !strings.HasPrefix(target, "unix:") {
		target = "unix:" + target // gRPC's unix:path form, absolute or relative
	}
	wait := minBackoff
	for {
		name, err := getPluginInfo(ctx, target)
		if err == nil {
			return name, nil
		}
		log.Printf("CSI driver on %s: GetPluginInfo: %v (retrying in %s)", address, err, wait)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBackoff)
	}
}

// getPluginInfo makes one try, on a connection of its own so that gRPC's
// reconnect backoff does not outlast the driver's start.
func getPluginInfo(ctx context.Context, target string) (string, error) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return "", err
	}
	if info.GetName() == "" {
		return "", errors.New("the driver returned an empty name")
	}
	return info.GetName(), nil
}

func run() error {
	if *kubeletRegistrationPath == "" {
		return errors.New("--kubelet-registration-path is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	driver, err := driverName(ctx, *csiAddress)
	if err != nil {
		log.Printf("stopped before the CSI driver answered: %v", err)
		return nil
	}
	log.Printf("CSI driver name: %q", driver)

	socket := filepath.Join(*pluginRegistrationPath, driver+"-reg.sock")
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	old := syscall.Umask(0o077) // the socket is kubelet's (root's) alone
	l, err := net.Listen("unix", socket)
	syscall.Umask(old)
	if err != nil {
		return err
	}
	defer os.Remove(socket)

	r := &registrar{driver: driver, endpoint: *kubeletRegistrationPath}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, r)
	errs := make(chan error, 2)
	go func() { errs <- s.Serve(l) }()
	log.Printf("serving registration of %s (endpoint %s) on %s", driver, *kubeletRegistrationPath, socket)

	if *httpEndpoint != "" {
		hl, err := net.Listen("tcp", *httpEndpoint)
		if err != nil {
			s.Stop()
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			if err := r.health(socket); err != nil {
				log.Printf("health check failed: %v", err)
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			_, _ = w.Write([]byte("ok"))
		})
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		defer hs.Close()
		go func() { errs <- hs.Serve(hl) }()
		log.Printf("serving /healthz on %s", hl.Addr())
	}

	select {
	case <-ctx.Done():
		log.Printf("stopping")
		s.Stop()
		return nil
	case err := <-errs:
		s.Stop()
		return err
	}
}

func main() {
	flag.Parse()
	if flag.NArg() > 0 {
		log.Fatalf("unexpected arguments: %q", flag.Args())
	}
	if err := run(); err != nil {
		log.Fatal(err)
	}
}
