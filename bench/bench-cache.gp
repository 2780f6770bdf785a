# bench/bench-cache.gp: plot bench-cache's CSV files (bench/run-cache runs it on the host).
#   gnuplot -e "dir='build/bench-results'" bench/bench-cache.gp   -> DIR/bench-cache.png
# Left: median reg + release (µs) vs size, log-log, per series. Middle and right: the
# shared-PD comparison as bars (wall time until all N registered; odpd's VmPin), for all N
# starting at once (shared, own) and one after another (shared-seq, own-seq).
if (!exists("dir")) dir = "build/bench-results"
set terminal pngcairo size 1900,640 font ",10" noenhanced
set output dir."/bench-cache.png"
set datafile separator ","
set datafile columnheaders
set multiplot layout 1,3 title "odpd registration cache and shared PDs, one qemu TCG + Soft-RoCE run (compare within the run only)"

set title "reg + release, median µs vs size (log-log)"
set logscale xy
set xlabel "bytes registered"
set ylabel "µs (median)"
set format y "%.0f"
set xtics ("4K" 4096, "64K" 65536, "1M" 1048576, "16M" 16777216, "256M" 268435456)
set key top left
set grid
plot dir."/reg-direct.csv"    using "size_bytes":"median_us" with linespoints lw 2 pt 7 title "direct ibv_reg_mr+dereg", \
     dir."/reg-miss.csv"      using "size_bytes":"median_us" with linespoints lw 2 pt 5 title "odpd miss (NO_CACHE)", \
     dir."/reg-hit.csv"       using "size_bytes":"median_us" with linespoints lw 2 pt 9 title "odpd hit", \
     dir."/reg-relaxed.csv"   using "size_bytes":"median_us" with linespoints lw 2 pt 11 title "odpd relaxed release", \
     dir."/reg-hit-nopop.csv" using "size_bytes":"median_us" with linespoints lw 1 dt 2 pt 1 title "odpd hit, NO_POPULATE"

unset logscale
stats dir."/shared-pd.csv" using "segment_bytes" nooutput
set xtics autofreq
set xlabel sprintf("N processes registering one %.0f MiB segment", STATS_max / 1048576)
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set key top left
set grid ytics

set title "wall time until all N registered"
set ylabel "ms (median of rounds)"
set yrange [0:*]
plot dir."/shared-pd.csv" using (column("wall_shared_us")/1000):xtic(1) title "shared PD, all at once", \
     ''                   using (column("wall_own_us")/1000) title "own PDs, all at once", \
     ''                   using (column("wall_shared-seq_us")/1000) title "shared PD, one after another", \
     ''                   using (column("wall_own-seq_us")/1000) title "own PDs, one after another"

set title "odpd's VmPin while all N hold their MR (log scale)"
set ylabel "MiB"
set logscale y
set yrange [16:*]
plot dir."/shared-pd.csv" using (column("vmpin_shared_kb")/1024):xtic(1) title "shared PD, all at once", \
     ''                   using (column("vmpin_own_kb")/1024) title "own PDs, all at once", \
     ''                   using (column("vmpin_shared-seq_kb")/1024) title "shared PD, one after another", \
     ''                   using (column("vmpin_own-seq_kb")/1024) title "own PDs, one after another"
unset multiplot
