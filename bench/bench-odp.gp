# bench/bench-odp.gp: plot bench-odp's CSV files (bench/run-odp runs it on the host).
#   gnuplot -e "dir='build/bench-results'" bench/bench-odp.gp   -> DIR/bench-odp.png
# Left: median odpd_reg + odpd_dereg (µs) vs size on fresh pages, pinned vs ODP (log-log).
# Middle: the first RDMA READ (odpd_verify) of a fresh ODP MR, without and with a prefetch
# (odpd_advise_mr FLUSH) before it, the second READ, and a pinned MR's first READ.
# Right: what a prefetch costs per MiB (pages written first / absent) next to pinned odpd_reg.
# A series the run skipped (no advise_mr) is "nan" in the CSV and not drawn.
if (!exists("dir")) dir = "build/bench-results"
set terminal pngcairo size 1900,640 font ",10" noenhanced
set output dir."/bench-odp.png"
set datafile separator ","
set datafile columnheaders
set datafile missing "nan"
set multiplot layout 1,3 title "odpd on-demand paging vs pinned, one qemu TCG + Soft-RoCE run (compare within the run only)"

set logscale xy
set format y "%.0f"
set xtics ("4K" 4096, "64K" 65536, "1M" 1048576, "4M" 4194304, "16M" 16777216, "64M" 67108864, "256M" 268435456)
set key top left
set grid

set title "odpd_reg + odpd_dereg on fresh pages, median µs"
set xlabel "bytes registered"
set ylabel "µs (median)"
plot dir."/odp-reg-pinned.csv"       using "size_bytes":"median_us" with linespoints lw 2 pt 7 title "pinned", \
     dir."/odp-reg-odp.csv"          using "size_bytes":"median_us" with linespoints lw 2 pt 5 title "ODP", \
     dir."/odp-reg-odp-prefetch.csv" using "size_bytes":"median_us" with linespoints lw 2 pt 9 title "ODP + ODPD_REG_PREFETCH", \
     dir."/odp-reg-odp.csv"          using "size_bytes":"reg_median_us" with linespoints lw 1 dt 2 pt 4 title "ODP, reg only", \
     dir."/odp-reg-odp.csv"          using "size_bytes":"dereg_median_us" with linespoints lw 1 dt 3 pt 6 title "ODP, dereg only"

set title "first RDMA READ (odpd_verify) of a fresh MR, median µs"
set xlabel "MR size (bytes), read whole"
plot dir."/odp-first-read.csv" using "size_bytes":"odp_read_cold_us" with linespoints lw 2 pt 7 title "ODP, first READ (no prefetch)", \
     ''                        using "size_bytes":(column("prefetch_advise_us") + column("prefetch_read_us")) with linespoints lw 2 pt 5 title "ODP, advise FLUSH + READ", \
     ''                        using "size_bytes":"prefetch_read_us" with linespoints lw 1 dt 2 pt 4 title "ODP, READ after advise", \
     ''                        using "size_bytes":"odp_read_warm_us" with linespoints lw 1 dt 3 pt 6 title "ODP, second READ (warm)", \
     ''                        using "size_bytes":"pinned_read_us" with linespoints lw 2 pt 9 title "pinned, first READ"

set title "prefetch (advise PREFETCH_WRITE, FLUSH) per MiB"
set xlabel "bytes prefetched (one fresh ODP MR)"
set ylabel "µs per MiB (median)"
plot dir."/odp-prefetch.csv" using "size_bytes":"written_us_per_mib" with linespoints lw 2 pt 7 title "pages written by the application", \
     ''                      using "size_bytes":"absent_us_per_mib" with linespoints lw 2 pt 5 title "pages absent (allocated by the prefetch)", \
     ''                      using "size_bytes":"pinned_reg_us_per_mib" with linespoints lw 1 dt 2 pt 9 title "pinned odpd_reg, fresh pages"
unset multiplot
