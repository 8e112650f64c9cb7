# The one OCI image: every binary under /bin and /artifacts/libvgpu.so
# (what libsync installs on the host). Non-root by default, no shell.
{ pkgs, kai-webhook, kai-node, kai-csi, kai-aggregator, kubectl-vgpu, hami-core }:
let
  artifacts = pkgs.runCommand "kai-artifacts" { } ''
    install -Dm644 ${hami-core}/lib/libvgpu.so $out/artifacts/libvgpu.so
    mkdir -p $out/bin
    ln -s ${kai-webhook}/bin/kai-webhook $out/bin/kai-webhook
    ln -s ${kai-node}/bin/kai-node $out/bin/kai-node
    ln -s ${kai-csi}/bin/kai-csi $out/bin/kai-csi
    ln -s ${kai-aggregator}/bin/kai-aggregator $out/bin/kai-aggregator
    ln -s ${kubectl-vgpu}/bin/kubectl-vgpu $out/bin/kubectl-vgpu
  '';
in
pkgs.dockerTools.buildLayeredImage {
  name = "kai-resource-isolator";
  tag = "0.1.0";
  contents = [ artifacts pkgs.cacert ];
  # A writable /tmp: `kai-node selftest` (run from this image as 65532)
  # makes its scratch directory there.
  extraCommands = ''
    mkdir -p tmp
    chmod 1777 tmp
  '';
  config = {
    User = "65532:65532";
    Entrypoint = [ "/bin/kai-webhook" ];
    Env = [ "SSL_CERT_FILE=${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt" ];
    Labels = {
      "org.opencontainers.image.title" = "kai-resource-isolator";
      "org.opencontainers.image.source" = "https://github.com/kai-resource-isolator/kai-resource-isolator";
    };
  };
}
