// inline-volumes stands in for kubelet's side of a CSI ephemeral inline volume
// when kind-tests/csi-sanity.sh runs csi-sanity against kai-csi.
//
// kai-csi has no controller service: kubelet itself names an inline volume
// ("csi-" + sha256 of pod UID and volume name) and hands NodePublishVolume a
// volume_context of the pod's volumeAttributes plus csi.storage.k8s.io/
// ephemeral and, with podInfoOnMount, the pod's name, namespace, UID and
// service account. csi-sanity only ever calls NodePublishVolume with the
// volume_id and volume_context of a volume it got from CreateVolume, so this
// program serves CreateVolume/DeleteVolume (and the Identity service csi-sanity
// also checks on a controller endpoint) on csi-sanity's --csi.controllerendpoint
// and answers each CreateVolume the way kubelet would build an inline volume
// for a fresh pod: a new pod UID per volume, the --csi.testvolumeparameters
// file's entries (CreateVolumeRequest.parameters) as the volumeAttributes.
// It talks only to csi-sanity, never to kai-csi.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const volumeName = "kai-resource-isolator-vgpu" // the webhook's volume name

type server struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer

	mu      sync.Mutex
	volumes map[string]*csi.Volume // by CreateVolume name, so a repeated CreateVolume is idempotent
	// podUID, when set, is every volume's pod: kai-csi checks the pod UID
	// against the kubelet pod directory of the target, and csi-sanity's
	// targets all lie in one directory (--csi.mountdir).
	podUID string
}

func (s *server) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "inline-volumes.kind-tests.kai-resource-isolator.io", VendorVersion: "test"}, nil
}

func (s *server) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (s *server) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (s *server) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}, nil
}

func uuid4() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (s *server) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.volumes[req.GetName()]; ok {
		return &csi.CreateVolumeResponse{Volume: v}, nil
	}
	podUID := s.podUID
	if podUID == "" {
		podUID = uuid4()
	}
	sum := sha256.Sum256([]byte(podUID + volumeName)) // kubelet: makeVolumeHandle(podUID, volSourceSpecName)
	ctx := map[string]string{}
	for k, v := range req.GetParameters() {
		ctx[k] = v
	}
	ctx["csi.storage.k8s.io/ephemeral"] = "true"
	ctx["csi.storage.k8s.io/pod.uid"] = podUID
	ctx["csi.storage.k8s.io/pod.name"] = "sanity-" + podUID[:8]
	ctx["csi.storage.k8s.io/pod.namespace"] = "default"
	ctx["csi.storage.k8s.io/serviceAccount.name"] = "default"
	v := &csi.Volume{VolumeId: "csi-" + hex.EncodeToString(sum[:]), VolumeContext: ctx}
	s.volumes[req.GetName()] = v
	log.Printf("CreateVolume %s -> %s %v", req.GetName(), v.VolumeId, ctx)
	return &csi.CreateVolumeResponse{Volume: v}, nil
}

func (s *server) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, v := range s.volumes {
		if v.VolumeId == req.GetVolumeId() {
			delete(s.volumes, name)
		}
	}
	log.Printf("DeleteVolume %s", req.GetVolumeId())
	return &csi.DeleteVolumeResponse{}, nil
}

func main() {
	endpoint := flag.String("endpoint", "", "unix socket path to serve on")
	podUID := flag.String("pod-uid", "", "the pod UID of every volume (default: a new one per volume)")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("--endpoint is required")
	}
	_ = os.Remove(*endpoint)
	l, err := net.Listen("unix", *endpoint)
	if err != nil {
		log.Fatal(err)
	}
	g := grpc.NewServer()
	s := &server{volumes: map[string]*csi.Volume{}, podUID: *podUID}
	csi.RegisterIdentityServer(g, s)
	csi.RegisterControllerServer(g, s)
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
		g.Stop()
	}()
	if err := g.Serve(l); err != nil {
		log.Fatal(err)
	}
}
