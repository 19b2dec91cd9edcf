# Galactic CNI. `make test` runs unit and integration tests (integration
# needs root and skips, saying so, without it); `make demo` runs the whole
# story on one machine.
GO        ?= go
BIN       := $(CURDIR)/bin
CACHE     ?= $(or $(GALACTIC_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/galactic)
CONTROLLER_GEN := $(CACHE)/tools-$(shell sha256sum test/tools/go.sum | cut -c1-12)/controller-gen
# -count=1: integration tests build the binaries they run, which go test's
# result cache cannot see, so a cached pass could hide a changed plugin.
TEST_FLAGS ?= -timeout 45m -count=1

.PHONY: all deps build image manifests test unit integration generate verify-generated docs lint controlplane demo bench clean

all: build

# Everything built here is copied onto hosts or into the image: static
# (no libc to match), and -trimpath so the image does not depend on where
# the checkout lives.
STATIC    := CGO_ENABLED=0
GOFLAGS_STATIC := -trimpath

build:
	$(STATIC) $(GO) build $(GOFLAGS_STATIC) -o $(BIN)/ ./plugins/... ./gc/... ./router/... ./controller/... ./installer/...

# The one image (OCI layout archive $(IMAGE_TAR), reference by digest in
# $(IMAGE_REF)); IMAGE=registry/repo:tag also pushes it there. Every time
# in it is the commit's, so one commit gives one digest.
IMAGE     ?=
IMAGE_TAR ?= $(BIN)/galactic-image.tar
IMAGE_REF ?= $(BIN)/galactic-image.ref
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

image: build
	$(GO) run ./hack/image build --bin $(BIN) --out $(IMAGE_TAR) --ref-file $(IMAGE_REF) \
		--epoch $(SOURCE_DATE_EPOCH) $(if $(IMAGE),--push $(IMAGE))

# installer/manifests with the image by digest, into $(BIN)/manifests.
manifests: image
	$(GO) run ./hack/image manifests --ref-file $(IMAGE_REF) --src installer/manifests --out $(BIN)/manifests

# Debian packages the tests and the demo use (FRR, qemu, ...), when root.
deps:
	@hack/install-deps.sh

test: deps lint verify-generated build
	$(GO) test $(TEST_FLAGS) ./...

unit:
	$(GO) test -short ./pkg/... ./plugins/... ./gc/... ./router/... ./controller/... ./installer/...

integration: build
	$(GO) test $(TEST_FLAGS) ./test/...

$(CONTROLLER_GEN):
	@mkdir -p $(dir $@)
	cd test/tools && $(GO) build -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

# The API types' deepcopy code and CRDs, and the BPF programs' objects
# and loaders (pkg/filter/bpf/*.c through bpf2go, with clang-14 from
# hack/install-deps.sh).
generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./pkg/apis/...
	$(CONTROLLER_GEN) crd paths=./pkg/apis/... output:crd:dir=installer/manifests/crds
	$(GO) generate ./pkg/filter/

verify-generated: $(CONTROLLER_GEN)
	CONTROLLER_GEN=$(CONTROLLER_GEN) GO=$(GO) hack/verify-generated.sh .

# The generated part of the docs: the CLI reference from every shipped
# binary's -h (test/docs checks it in `make test`).
docs:
	$(GO) test -count=1 ./test/docs -run TestTheCLIReferenceIsCurrent -update

# The integration tests wait on observed state: their fixed sleeps (windows
# in which something must not happen, each a short timer of the test's
# config) add up to at most a minute (hack/sleeps says how it counts).
lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) run ./hack/sleeps -max 60s test/integration

controlplane:
	$(GO) run ./test/cmd/controlplane

demo: deps build
	$(GO) run ./test/cmd/demo

bench: build
	$(GO) run ./test/cmd/bench $(BENCH_FLAGS)

# Seeded random workload operations and faults with invariant checkers
# (docs/contributing/soak.md): SOAK_DURATION (default 10m), SOAK_SEED to replay,
# SOAK_STEPS to replay a prefix, SOAK_REPORT for the markdown report,
# SOAK_TRACE and SOAK_KEEP=1 to look into a violation, SOAK_VM=0 without
# the qemu guest.
.PHONY: soak
soak: deps build
	SOAK_DURATION=$(or $(SOAK_DURATION),10m) $(GO) run ./test/cmd/soak

# The harness's three-node cluster with the manifests applied, left
# running for a person (docs/contributing/development.md); cluster-down
# removes it.
.PHONY: cluster cluster-down
cluster: deps build
	$(GO) run ./test/cmd/cluster up

cluster-down:
	$(GO) run ./test/cmd/cluster down

clean:
	rm -rf $(BIN)
