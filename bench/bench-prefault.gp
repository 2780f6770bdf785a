# bench/bench-prefault.gp: bench/run-prefault's CSV (case op size median p10 p90) as bars,
# one per case and operation, clustered by size, log scale.
# gnuplot -e "csv='...'; out='...png'" bench/bench-prefault.gp
set terminal pngcairo size 1400,650 noenhanced
set output out
set title "Pinned registration and pre-faulting (bench/run-prefault, one VM boot; medians, p10-p90 bars)"
set ylabel "microseconds (log)"
set logscale y
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.6 border -1
set key off
set xtics rotate by -45 font ",8"
set grid ytics
plot csv using 4:5:6:xtic(sprintf("%s %s %d", stringcolumn(1), stringcolumn(2), $3)) lc rgb "#4477aa"
