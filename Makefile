# opqueued — build, run, test, benchmark, install.
#
#   make run     install what is missing, build, run the daemon on ./spool (file:// allowed under spool/examples)
#   make example drop the offline photo example into ./spool/inbox (the daemon of `make run` picks it up)
#   make test    install what is missing, build, run every test (what .ci/run does)
#   make campaigns  the reliability campaigns at full size (crash, faults, fuzz, load; root)
#   make bench   the benchmarks (release build)
#   make install binaries, unit, catalog, sysusers/tmpfiles snippets, man pages, completions (PREFIX=/usr/local);
#                as root it installs what `make release` built and never builds
#   make uninstall removes them (the user, the spool and its jobs stay)
#   make man     regenerate docs/man/opqueuectl.1 and opqueued.8 from the code (argument-parser's generate-manual),
#                keeping their hand-written sections
#   make sql     regenerate Sources/ClusterStore/Queries.generated.swift from the .sql files beside it
#   make install-files   the same without building, from BINARIES (the systemd tests install their debug build)
#   make deb     opqueued_<version>-1_amd64.deb: a release build with the Swift runtime linked in, for machines without
#                a toolchain, in .build-deb/ (VERSION=… and DEB_REVISION=… override the version); make test-debs: the
#                two DebianPackageTests installs, from the tests' debug build

SWIFT ?= swift
PREFIX ?= /usr/local
SPOOL ?= ./spool
# Debian packages the build needs (make run, make release).
APT_PACKAGES = pkg-config libpng-dev libjpeg-dev libcurl4-openssl-dev libsystemd-dev systemd
# And the tests (make test): mandoc lints the man pages; python3-prometheus-client parses the metrics; postgresql gives
# the binaries (initdb, pg_ctl, psql) of the cluster tests' throwaway servers (Tests/Support/PostgresServer.swift) and
# PgBouncer runs in front of one (Tests/Support/PgBouncer.swift); the packages' own services are never used.
# dpkg-dev builds the Debian packages DebianPackageTests installs (make test-debs). prometheus gives promtool, which
# checks the alerting rules of contrib/prometheus and runs their unit tests (MonitoringTests); its server is never used.
TEST_APT_PACKAGES = mandoc python3-prometheus-client postgresql pgbouncer dpkg-dev prometheus

.PHONY: sql run example test campaigns fuzz-codecs fuzz-plist fuzz-manifest deps build release bench install install-files uninstall man clean \
  deb deb-pack test-debs

UNITDIR ?= /etc/systemd/system
SYSUSERSDIR ?= /etc/sysusers.d
TMPFILESDIR ?= /etc/tmpfiles.d
CATALOGDIR ?= /usr/lib/systemd/catalog
BINARIES ?= .build/release
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d

# The cluster store's SQL (Sources/ClusterStore/SQL) embedded into Queries.generated.swift; a test fails when stale.
sql:
	python3 Sources/ClusterStore/SQL/generate.py

deps:
	@missing=""; for p in $(APT_PACKAGES) $(EXTRA_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

release: deps
	$(SWIFT) build -c release

# The walk-through's configuration: file:// downloads allowed under spool/examples (an absolute path, so it
# is written anew each time: the clone may have moved).
.PHONY: spool/opqueued.plist
spool/opqueued.plist:
	printf '<?xml version="1.0" encoding="UTF-8"?>\n<plist version="1.0"><dict><key>download</key><dict><key>fileRoots</key><array><string>%s</string></array></dict>%s</dict></plist>\n' "$(CURDIR)/spool/examples" \
	  '<key>commands</key><dict><key>gzip</key><dict><key>argv</key><array><string>/usr/bin/gzip</string><string>-c</string><string>-$${level}</string><string>$${input}</string></array><key>parameters</key><dict><key>level</key><array><string>1</string><string>6</string><string>9</string></array></dict><key>output</key><string>stdout</string><key>timeoutSeconds</key><integer>60</integer></dict></dict>' > $@

# The console: a terminal's events in the terminal, whether or not a journald listens.
run: release spool/opqueued.plist
	.build/release/opqueued --spool $(SPOOL) --config spool/opqueued.plist --log-target console

example:
	mkdir -p $(SPOOL)/inbox
	sed 's|@EXAMPLES@|$(CURDIR)/spool/examples|g' spool/examples/photos.plist.in > $(SPOOL)/inbox/.photos.plist
	mv $(SPOOL)/inbox/.photos.plist $(SPOOL)/inbox/photos.plist
	sed 's|@EXAMPLES@|$(CURDIR)/spool/examples|g' spool/examples/archive.plist.in > $(SPOOL)/inbox/.archive.plist
	mv $(SPOOL)/inbox/.archive.plist $(SPOOL)/inbox/archive.plist

# Bounded reliability campaigns (issue 5) after the tests; `make campaigns` runs them at full size.
CAMPAIGN = .build/debug/opqueue-campaign

# The fuzzers are built beside the package, not after the tests: each compiles a hand-picked set of sources, and a
# file of that set that starts to use something outside it breaks the build before any test runs. Beside it, because
# the package's build leaves a core idle for much of its time (one module at a time, its links). The three fuzzers
# run at once, each for FUZZ_SECONDS of wall-clock time.
test:
	$(MAKE) deps EXTRA_APT_PACKAGES="$(TEST_APT_PACKAGES)"
	$(MAKE) test-python
	$(MAKE) -j2 fuzzers build-tests
	$(MAKE) test-debs
	$(SWIFT) test
	$(CAMPAIGN) crash --jobs 300 --kills 40
	$(CAMPAIGN) faults --jobs 30
	$(CAMPAIGN) fuzz --manifests 400 --images 200
	$(CAMPAIGN) load --manifests 3000 --operations 50000
	$(MAKE) -j3 --output-sync=target run-fuzz-codecs run-fuzz-plist run-fuzz-manifest FUZZ_SECONDS=30

.PHONY: build-tests
build-tests:
	$(SWIFT) build --build-tests

# The tracing tests' OTLP receiver (Tests/Support/otlp_receiver.py) decodes with the OpenTelemetry protocol's own
# definitions: opentelemetry-proto from PyPI, into .build/python (not the system's Python).
.PHONY: test-python
test-python:
	@[ -d .build/python/opentelemetry/proto ] || python3 -m pip install -q --disable-pip-version-check --target .build/python opentelemetry-proto

.PHONY: fuzzers build-fuzz-codecs build-fuzz-plist build-fuzz-manifest run-fuzz-codecs run-fuzz-plist run-fuzz-manifest
fuzzers: build-fuzz-codecs build-fuzz-plist build-fuzz-manifest
fuzz-codecs: build-fuzz-codecs
	$(MAKE) run-fuzz-codecs
fuzz-plist: build-fuzz-plist
	$(MAKE) run-fuzz-plist
fuzz-manifest: build-fuzz-manifest
	$(MAKE) run-fuzz-manifest

# libFuzzer + AddressSanitizer on the C codec shim, seeded with the example photos and the test PNGs.
CLANG ?= $(dir $(realpath $(shell command -v $(SWIFT))))clang
FUZZ_SECONDS ?= 600
build-fuzz-codecs: deps
	mkdir -p .build/fuzz
	$(CLANG) -g -O1 -fuse-ld=lld -fsanitize=fuzzer,address -I Sources/CCodecs/include Sources/CCodecs/codecs.c \
	  Tests/Fuzz/codecs_fuzzer.c -ljpeg -lpng16 -o .build/fuzz/codecs_fuzzer
run-fuzz-codecs:
	mkdir -p .build/fuzz/corpus
	cp spool/examples/images/*.jpg .build/fuzz/corpus/
	python3 Tests/Support/make_pngs.py .build/fuzz/corpus
	.build/fuzz/codecs_fuzzer -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=.build/fuzz/ .build/fuzz/corpus

# libFuzzer + AddressSanitizer on the property-list reader and writer (Sources/PropertyList, no Foundation).
SWIFTC ?= $(dir $(realpath $(shell command -v $(SWIFT))))swiftc
build-fuzz-plist: deps
	mkdir -p .build/fuzz
	$(SWIFTC) -O -sanitize=fuzzer,address -use-ld=lld -parse-as-library -module-name PropertyList \
	  Sources/PropertyList/*.swift Tests/Fuzz/plist_fuzzer.swift -o .build/fuzz/plist_fuzzer
run-fuzz-plist:
	mkdir -p .build/fuzz/plist-corpus
	python3 Tests/Fuzz/make_plists.py .build/fuzz/plist-corpus
	cp spool/examples/photos.plist.in .build/fuzz/plist-corpus/
	SWIFT_BACKTRACE=enable=no .build/fuzz/plist_fuzzer -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 \
	  -artifact_prefix=.build/fuzz/ .build/fuzz/plist-corpus

campaigns: release
	$(SWIFT) build -c release --product opqueue-campaign
	.build/release/opqueue-campaign crash --jobs 3000 --kills 500
	.build/release/opqueue-campaign faults --jobs 200
	.build/release/opqueue-campaign fuzz --manifests 100000 --images 10000
	.build/release/opqueue-campaign load --manifests 100000 --operations 1000000
	$(MAKE) fuzz-codecs
	$(MAKE) fuzz-plist
	$(MAKE) fuzz-manifest

# libFuzzer + AddressSanitizer on manifest validation: the JobModel module (Sources/JobModel) built over the
# property-list reader, the engine's QoS types and cron (the Daemon target links libcurl, libjpeg and libsystemd,
# which are not built with the sanitizer).
FUZZ_MANIFEST = .build/fuzz/manifest
build-fuzz-manifest: deps
	mkdir -p $(FUZZ_MANIFEST)
	$(SWIFTC) -O -sanitize=fuzzer,address -parse-as-library -module-name PropertyList -emit-library -static \
	  -emit-module -emit-module-path $(FUZZ_MANIFEST)/PropertyList.swiftmodule -o $(FUZZ_MANIFEST)/libPropertyList.a Sources/PropertyList/*.swift
	$(SWIFTC) -O -sanitize=fuzzer,address -parse-as-library -module-name OperationEngine -emit-library -static \
	  -emit-module -emit-module-path $(FUZZ_MANIFEST)/OperationEngine.swiftmodule -o $(FUZZ_MANIFEST)/libOperationEngine.a \
	  Sources/OperationEngine/QualityOfService.swift Sources/OperationEngine/RateWindow.swift
	$(SWIFTC) -O -sanitize=fuzzer,address -parse-as-library -module-name SystemCalls -emit-library -static \
	  -emit-module -emit-module-path $(FUZZ_MANIFEST)/SystemCalls.swiftmodule -o $(FUZZ_MANIFEST)/libSystemCalls.a \
	  Sources/SystemCalls/SystemCalls.swift
	$(SWIFTC) -O -sanitize=fuzzer,address -parse-as-library -module-name Cron -emit-library -static -I $(FUZZ_MANIFEST) \
	  -emit-module -emit-module-path $(FUZZ_MANIFEST)/Cron.swiftmodule -o $(FUZZ_MANIFEST)/libCron.a Sources/Cron/*.swift
	$(SWIFTC) -O -sanitize=fuzzer,address -parse-as-library -module-name JobModel -package-name opqueued -emit-library -static \
	  -I $(FUZZ_MANIFEST) -emit-module -emit-module-path $(FUZZ_MANIFEST)/JobModel.swiftmodule -o $(FUZZ_MANIFEST)/libJobModel.a \
	  Sources/JobModel/*.swift
	$(SWIFTC) -O -sanitize=fuzzer,address -use-ld=lld -parse-as-library -module-name ManifestFuzz -I $(FUZZ_MANIFEST) -L $(FUZZ_MANIFEST) \
	  -lJobModel -lPropertyList -lOperationEngine -lSystemCalls -lCron Tests/Fuzz/manifest_fuzzer.swift -o $(FUZZ_MANIFEST)/manifest_fuzzer
run-fuzz-manifest:
	mkdir -p $(FUZZ_MANIFEST)/corpus
	python3 Tests/Fuzz/make_manifests.py $(FUZZ_MANIFEST)/corpus
	cp spool/examples/hello.plist $(FUZZ_MANIFEST)/corpus/
	SWIFT_BACKTRACE=enable=no $(FUZZ_MANIFEST)/manifest_fuzzer -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 \
	  -artifact_prefix=$(FUZZ_MANIFEST)/ $(FUZZ_MANIFEST)/corpus

# The anchors the image benchmark compares with.
BENCH_PACKAGES = imagemagick libvips-tools libjpeg-turbo-progs

bench: release
	@missing=""; for p in $(BENCH_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; fi
	python3 -c 'import pyvips' 2>/dev/null || pip install -q pyvips || true
	.build/release/opqueue-bench engine
	.build/release/opqueue-bench spool
	.build/release/opqueue-bench images

# Never builds as root (root-owned files in .build/ would stop the next build as yourself): `make release` first,
# then `sudo make install` installs what was built. As another user it builds, then installs (DESTDIR, say).
install:
	@if [ "$$(id -u)" = 0 ]; then \
	  [ -x $(BINARIES)/opqueued ] || { echo "make install: nothing is built in $(BINARIES): run 'make release' as yourself first (make install never builds as root)" >&2; exit 1; }; \
	else $(MAKE) release; fi
	$(MAKE) install-files

install-files:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(CATALOGDIR)
	install -m 0755 $(BINARIES)/opqueued $(BINARIES)/opqueuectl $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/lib/opqueued
	install -m 0755 $(BINARIES)/opqueued-supervise $(DESTDIR)$(PREFIX)/lib/opqueued/
	sed 's|@BINDIR@|$(PREFIX)/bin|' systemd/opqueued.service > $(DESTDIR)$(UNITDIR)/opqueued.service
	install -m 0644 systemd/opqueued.sysusers $(DESTDIR)$(SYSUSERSDIR)/opqueued.conf
	install -m 0644 systemd/opqueued.tmpfiles $(DESTDIR)$(TMPFILESDIR)/opqueued.conf
	install -m 0644 systemd/opqueued.catalog $(DESTDIR)$(CATALOGDIR)/opqueued.catalog
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8
	install -m 0644 docs/man/opqueuectl.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 docs/man/opqueued.plist.5 $(DESTDIR)$(MANDIR)/man5/
	install -m 0644 docs/man/opqueued.8 $(DESTDIR)$(MANDIR)/man8/
	install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	$(BINARIES)/opqueuectl --generate-completion-script bash > $(DESTDIR)$(BASHCOMPDIR)/opqueuectl
	$(BINARIES)/opqueuectl --generate-completion-script zsh > $(DESTDIR)$(ZSHCOMPDIR)/_opqueuectl
	$(BINARIES)/opqueuectl --generate-completion-script fish > $(DESTDIR)$(FISHCOMPDIR)/opqueuectl.fish
	@if [ -z "$(DESTDIR)" ]; then \
	  step() { echo "make install: $$*"; "$$@" || echo "make install: '$$*' failed (exit $$?): see above" >&2; }; \
	  step systemd-sysusers $(SYSUSERSDIR)/opqueued.conf; \
	  step systemd-tmpfiles --create $(TMPFILESDIR)/opqueued.conf; \
	  step journalctl --update-catalog; \
	  if [ -d /run/systemd/system ]; then step systemctl daemon-reload; \
	  else echo "make install: systemd is not running here: no daemon-reload"; fi; \
	  id opqueued >/dev/null 2>&1 && [ -d /var/spool/opqueued ] && \
	    echo "make install: the user opqueued and /var/spool/opqueued are there; next: systemctl enable --now opqueued"; \
	fi

# What install-files put in place, removed; the user, the spool and its jobs, and /etc/opqueued stay.
uninstall:
	-[ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ] && systemctl disable --now opqueued
	rm -f $(DESTDIR)$(PREFIX)/bin/opqueued $(DESTDIR)$(PREFIX)/bin/opqueuectl $(DESTDIR)$(PREFIX)/lib/opqueued/opqueued-supervise
	-rmdir $(DESTDIR)$(PREFIX)/lib/opqueued
	rm -f $(DESTDIR)$(UNITDIR)/opqueued.service $(DESTDIR)$(SYSUSERSDIR)/opqueued.conf $(DESTDIR)$(TMPFILESDIR)/opqueued.conf
	rm -f $(DESTDIR)$(CATALOGDIR)/opqueued.catalog
	rm -f $(DESTDIR)$(MANDIR)/man1/opqueuectl.1 $(DESTDIR)$(MANDIR)/man5/opqueued.plist.5 $(DESTDIR)$(MANDIR)/man8/opqueued.8
	rm -f $(DESTDIR)$(BASHCOMPDIR)/opqueuectl $(DESTDIR)$(ZSHCOMPDIR)/_opqueuectl $(DESTDIR)$(FISHCOMPDIR)/opqueuectl.fish
	-[ -z "$(DESTDIR)" ] && journalctl --update-catalog
	-[ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ] && systemctl daemon-reload

# A Debian package (SPEC §7; packaging/deb/ holds its own files): what install-files installs under /usr, from
# binaries with the Swift runtime linked in statically (their own build folder, DEB_SCRATCH), stripped, the man
# pages and changelog gzipped, a commented /etc/opqueued/opqueued.plist (a conffile) and the unit's drop-in that
# reads it, the maintainer scripts; Depends computed by dpkg-shlibdeps (in a throwaway folder: it wants a
# debian/control), plus systemd. The opqueued user comes from sysusers, not adduser.
VERSION ?= $(shell sed -n 's/.*print("opqueued \([^"]*\)").*/\1/p' Sources/opqueued/Opqueued.swift)
CONFIG ?= release
DEB_SCRATCH ?= .build-deb
DEB_OUT ?= .
DEB_ROOT = $(DEB_SCRATCH)/deb-root
DEB_ARCH = $(shell dpkg --print-architecture)
DEB_MAINTAINER ?= $(shell git log -1 --format='%an <%ae>')
# The changelog's date: the last commit's, so that two builds of one commit are the same.
DEB_DATE ?= $(shell date -R -d @$$(git log -1 --format=%ct))
# The package's version: the project's, and a Debian revision (the packaging's own changes; it also makes
# changelog.Debian.gz the changelog's right name).
DEB_REVISION ?= 1
DEB_VERSION = $(VERSION)-$(DEB_REVISION)
DEB_PACKAGE = $(DEB_OUT)/opqueued_$(DEB_VERSION)_$(DEB_ARCH).deb
DEB_COMPRESSION ?= -Zxz
deb:
	$(MAKE) deps EXTRA_APT_PACKAGES=dpkg-dev
	$(SWIFT) build -c $(CONFIG) --static-swift-stdlib --scratch-path $(DEB_SCRATCH) --product opqueued-supervise
	for product in opqueued opqueuectl; do \
	  $(SWIFT) build -c $(CONFIG) --static-swift-stdlib --scratch-path $(DEB_SCRATCH) --product $$product $(DEB_LINKFLAGS) || exit 1; done
	$(MAKE) deb-pack DEB_BINARIES=$(DEB_SCRATCH)/$(CONFIG)

# The package from binaries already built (DEB_BINARIES) with the Swift runtime linked in.
deb-pack:
	rm -rf $(DEB_ROOT)
	$(MAKE) install-files DESTDIR=$(abspath $(DEB_ROOT)) BINARIES=$(DEB_BINARIES) PREFIX=/usr \
	  UNITDIR=/usr/lib/systemd/system SYSUSERSDIR=/usr/lib/sysusers.d TMPFILESDIR=/usr/lib/tmpfiles.d \
	  CATALOGDIR=/usr/lib/systemd/catalog ZSHCOMPDIR=/usr/share/zsh/vendor-completions
	strip --remove-section=.comment --remove-section=.note $(DEB_ROOT)/usr/bin/* $(DEB_ROOT)/usr/lib/opqueued/*
	gzip -9n $(DEB_ROOT)/usr/share/man/man*/*
	sed -i '1{/^#!/d}' $(DEB_ROOT)/usr/share/bash-completion/completions/opqueuectl
	install -D -m 0644 packaging/deb/lintian-overrides $(DEB_ROOT)/usr/share/lintian/overrides/opqueued
	install -D -m 0644 packaging/deb/config.conf $(DEB_ROOT)/usr/lib/systemd/system/opqueued.service.d/config.conf
	install -D -m 0644 packaging/deb/opqueued.plist $(DEB_ROOT)/etc/opqueued/opqueued.plist
	install -D -m 0644 packaging/deb/copyright $(DEB_ROOT)/usr/share/doc/opqueued/copyright
	sed -e 's|@VERSION@|$(DEB_VERSION)|' -e 's|@MAINTAINER@|$(DEB_MAINTAINER)|' -e 's|@DATE@|$(DEB_DATE)|' packaging/deb/changelog.in \
	  | gzip -9n > $(DEB_ROOT)/usr/share/doc/opqueued/changelog.Debian.gz
	find $(DEB_ROOT) -type d -exec chmod 0755 {} + && find $(DEB_ROOT) -type f -exec chmod go-w,a+r {} +
	install -d $(DEB_ROOT)/DEBIAN
	install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm $(DEB_ROOT)/DEBIAN/
	echo /etc/opqueued/opqueued.plist > $(DEB_ROOT)/DEBIAN/conffiles
	cd $(DEB_ROOT) && find usr -type f -print0 | sort -z | xargs -0 md5sum > DEBIAN/md5sums
	shlibs=$$(d=$$(mktemp -d) && mkdir $$d/debian && printf 'Source: opqueued\n\nPackage: opqueued\nArchitecture: any\n' > $$d/debian/control \
	  && (cd $$d && dpkg-shlibdeps -O $(addprefix $(abspath $(DEB_ROOT))/usr/bin/,opqueued opqueuectl)); s=$$?; rm -rf $$d; exit $$s) \
	  && sed -e 's|@VERSION@|$(DEB_VERSION)|' -e 's|@ARCH@|$(DEB_ARCH)|' -e 's|@MAINTAINER@|$(DEB_MAINTAINER)|' \
	  -e "s|@SIZE@|$$(du -sk --exclude=DEBIAN $(DEB_ROOT) | cut -f1)|" -e "s|@DEPENDS@|$${shlibs#shlibs:Depends=}, systemd|" \
	  packaging/deb/control.in > $(DEB_ROOT)/DEBIAN/control
	mkdir -p $(DEB_OUT)
	dpkg-deb --root-owner-group $(DEB_COMPRESSION) --build $(DEB_ROOT) $(DEB_PACKAGE)

# The two packages DebianPackageTests installs, one upgrading the other, packed twice under two versions, lightly
# compressed, into .build/test-debs: the tests' own debug build (`swift build --build-tests` first) linked again with
# the Swift runtime linked in (packaging/deb/relink-static.py: seconds, where a second static build of the whole tree
# took minutes). Made before `swift test`, which holds .build's lock: a test cannot build there itself.
TEST_DEBS = .build/test-debs
test-debs:
	rm -rf $(TEST_DEBS)
	python3 packaging/deb/relink-static.py .build/debug.yaml $(TEST_DEBS)/bin opqueued opqueuectl
	cp .build/debug/opqueued-supervise $(TEST_DEBS)/bin/
	for n in 1 2; do $(MAKE) deb-pack DEB_BINARIES=$(TEST_DEBS)/bin DEB_SCRATCH=$(TEST_DEBS)/scratch DEB_OUT=$(TEST_DEBS) \
	  VERSION=$(VERSION)+test$$n DEB_COMPRESSION="-Zgzip -z1" || exit 1; done
	rm -rf $(TEST_DEBS)/scratch $(TEST_DEBS)/bin

# The man pages of the two programs come from their argument-parser definitions (help, abstracts,
# discussions) through argument-parser's generate-manual plugin; opqueued.plist(5) is written by hand.
# They are committed, so `man -l docs/man/…` works from a clone; a test checks that opqueuectl(1) names
# every subcommand and option. MAN_DATE keeps the output the same from one run to the next.
MAN_DATE ?= 2026-11-23
MAN_OUT = .build/plugins/GenerateManual/outputs
man:
	$(SWIFT) package --allow-writing-to-package-directory generate-manual --configuration debug --date $(MAN_DATE) --section 1
	cp $(MAN_OUT)/opqueuectl/opqueuectl.1 docs/man/opqueuectl.1.new
	python3 docs/man/tidy-mdoc.py --keep docs/man/opqueuectl.1 docs/man/opqueuectl.1.new opqueued.plist:5 opqueued:8 journalctl:1
	mv docs/man/opqueuectl.1.new docs/man/opqueuectl.1
	$(SWIFT) package --allow-writing-to-package-directory generate-manual --configuration debug --date $(MAN_DATE) --section 8
	cp $(MAN_OUT)/opqueued/opqueued.8 docs/man/opqueued.8.new
	python3 docs/man/tidy-mdoc.py --keep docs/man/opqueued.8 docs/man/opqueued.8.new opqueuectl:1 opqueued.plist:5 journalctl:1 systemd.service:5
	mv docs/man/opqueued.8.new docs/man/opqueued.8

clean:
	rm -rf .build
