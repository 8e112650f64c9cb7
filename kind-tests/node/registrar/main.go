// The registration half of node-driver-registrar, for kind-tests/node.sh:
// serves kubelet's plugin registration API (pluginregistration/v1) on a
// socket in kubelet's plugins_registry and tells kubelet where the CSI
// driver's own socket is. kubelet dials a registration socket with its path
// as the HTTP/2 :authority, which a Go gRPC server accepts and an h2 (Rust)
// server refuses with PROTOCOL_ERROR; node.py uses this to reach kai-csi's
// CSI socket when kai-csi's own registration cannot be used.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: r.driver, Endpoint: r.endpoint,
		SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		log.Printf("kubelet registered %s at %s", r.driver, r.endpoint)
	} else {
		log.Printf("kubelet refused %s: %s", r.driver, s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	driver := flag.String("driver", "", "CSI driver name")
	endpoint := flag.String("endpoint", "", "the CSI driver's socket path as kubelet sees it")
	socket := flag.String("socket", "", "registration socket to serve, in kubelet's plugins_registry")
	flag.Parse()
	if *driver == "" || *endpoint == "" || *socket == "" {
		log.Fatal("-driver, -endpoint and -socket are required")
	}
	_ = os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, &registrar{driver: *driver, endpoint: *endpoint})
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
		s.Stop()
		_ = os.Remove(*socket)
		os.Exit(0)
	}()
	log.Printf("serving registration for %s on %s", *driver, *socket)
	if err := s.Serve(l); err != nil {
		log.Fatal(err)
	}
}
