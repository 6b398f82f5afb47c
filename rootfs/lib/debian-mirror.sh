# Sourced by the install scripts and the image recipes: picks the Debian mirror
# to fetch SUITE from. Not executable on its own.
#
#   debian_mirror SUITE     prints the first URI of the host's apt sources (and
#                           then deb.debian.org) whose dists/SUITE/Release can be
#                           fetched, and says on stderr which one it used and
#                           which it skipped; returns 1, naming every URI it
#                           tried, when none answers.
#   debian_mirror SUITE LISTED
#                           the same, among the URIs listed for suite LISTED
#                           (bookworm-backports from the mirrors of bookworm).
#
# The sources are read in apt's order: sources.list, then sources.list.d/*.list
# and *.sources (deb822). Commented-out lines and paragraphs are not sources,
# and security / updates archives do not carry SUITE. Each candidate is probed
# with apt's own downloader, so apt's proxy settings apply; DEBIAN_MIRROR set
# in the environment is used as it is, without probing.

debian_mirror_candidates() {
	local suite=$1 f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -r $f ]] || continue
		# one-line format: deb [options] URI SUITE COMPONENTS...
		sed -E 's/#.*//; s/\[[^]]*\]//' "$f" |
			awk -v s="$suite" '$1 == "deb" && $3 == s { print $2 }'
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -r $f ]] || continue
		# deb822 format: paragraphs of "Key: value" lines separated by blank lines
		awk -v s="$suite" '
			function flush() {
				if (enabled && types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " s " ")) {
					n = split(uris, u, " "); for (i = 1; i <= n; i++) print u[i]
				}
				types = ""; suites = ""; uris = ""; enabled = 1
			}
			BEGIN { enabled = 1 }
			/^[ \t]*#/ { next }
			/^[ \t]*$/ { flush(); next }
			/^Types:/   { sub(/^Types:[ \t]*/, "");   types = $0 }
			/^Suites:/  { sub(/^Suites:[ \t]*/, "");  suites = $0 }
			/^URIs:/    { sub(/^URIs:[ \t]*/, "");    uris = $0 }
			/^Enabled:[ \t]*(no|false)/ { enabled = 0 }
			END { flush() }' "$f"
	done
	echo "http://deb.debian.org/debian"
}

debian_mirror() {
	local suite=${1:?usage: debian_mirror SUITE [LISTED]} uri probe tried=() seen=" "
	local listed=${2:-$suite}
	if [[ -n ${DEBIAN_MIRROR:-} ]]; then
		echo "debian mirror: $DEBIAN_MIRROR (from DEBIAN_MIRROR)" >&2
		echo "$DEBIAN_MIRROR"
		return 0
	fi
	probe=$(mktemp)
	while read -r uri; do
		uri=${uri%/}
		[[ -n $uri && $seen != *" $uri "* ]] || continue
		seen+="$uri "
		if timeout 30 /usr/lib/apt/apt-helper download-file "$uri/dists/$suite/Release" "$probe" >/dev/null 2>&1; then
			rm -f "$probe"
			if ((${#tried[@]})); then
				echo "debian mirror: $uri (did not answer for $suite: ${tried[*]})" >&2
			else
				echo "debian mirror: $uri" >&2
			fi
			echo "$uri"
			return 0
		fi
		tried+=("$uri")
	done < <(debian_mirror_candidates "$listed")
	rm -f "$probe"
	echo "no Debian mirror serves $suite; tried: ${tried[*]}" >&2
	echo "fix the URIs in /etc/apt/sources.list(.d), or set DEBIAN_MIRROR to one that works" >&2
	return 1
}
