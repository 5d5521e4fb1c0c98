/* the head map: written below */
